"""The I/O loop with scripted machines over real loopback sockets: what it feeds, what it carries out,
and that nothing a handler raises ends it."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq
from psrv.transport.codec import encode_frames
from psrv.transport.config import TransportConfig
from psrv.transport.errors import FrameRejectedError, NotRunningError, TransportError
from psrv.transport.events import (
    ChunkArrived,
    Connect,
    Download,
    Dropped,
    Ready,
    Received,
    Reply,
    Send,
    Started,
    Stop,
    Stopping,
    Submit,
    Tick,
)
from psrv.transport.loop import Loop
from psrv.transport.messages import Message, Op

pytestmark = pytest.mark.timeout(60)


def cfg(**changes) -> TransportConfig:
    return TransportConfig(host="127.0.0.1", linger_s=0.2, **changes)


class Scripted:
    """Records every event; ``script[type](event)`` gives the actions (Started -> Ready by default)."""

    def __init__(self, **script) -> None:
        self.events: list = []
        self.script = script

    def handle(self, event, now: float) -> list:
        self.events.append(event)
        fn = self.script.get(type(event).__name__)
        if fn is not None:
            return list(fn(event))
        return [Ready()] if type(event) is Started else []

    def of(self, kind) -> list:
        return [e for e in list(self.events) if type(e) is kind]


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def status(src: int = -1) -> Message:
    return Message(Op.STATUS_REQUEST, {}, src=src)


def test_a_handler_that_raises_is_counted_and_the_loop_goes_on() -> None:
    def boom(event):
        if event.message.src == 1:
            raise FrameRejectedError("bad_sender", "scripted")
        if event.message.src == 2:
            raise TransportError("scripted")
        raise ZeroDivisionError("scripted")

    machine = Scripted(Received=boom, Tick=lambda e: [], Submit=lambda e: 1 / 0)
    loop = Loop(cfg(), machine, role="test")
    loop.start()
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://{loop.address}")
        for src in (0, 1, 2):
            dealer.send_multipart(encode_frames(status(src)))
        dealer.send_multipart([b"\x93not msgpack"])
        loop.post(Submit("anything"))
        wait_for(lambda: loop.counters.rejected_total() >= 5)
        assert loop.running and loop.call(lambda: 42) == 42
        rejected = loop.counters.snapshot()["rejected"]
        assert rejected == {"handler_error": 2, "bad_sender": 1, "bad_message": 1, "bad_header": 1}
        assert machine.of(Tick), "ticks go on"
        dealer.close(0)
    finally:
        loop.stop()
        ctx.term()
    assert not loop.running and loop.error is None
    assert type(machine.events[-1]) is Stopping


def test_posted_events_come_in_order_with_more_and_a_call_sees_them_done() -> None:
    machine = Scripted()
    loop = Loop(cfg(), machine, role="test")
    for i in range(3):  # queued before the loop runs: delivered in one drain
        loop.post(Submit(i))
    loop.start()
    try:
        commands = loop.call(lambda: machine.of(Submit))
        assert [(c.payload, c.more) for c in commands] == [(0, True), (1, True), (2, False)]
    finally:
        loop.stop()


def test_send_reply_and_the_routing_id_a_connection_presents() -> None:
    rid = b"\xaapresented-id"

    def answer(event):  # B: reply to whoever asked, on its own connection
        yield Reply(event.routing_id, Message(Op.STATUS_REPLY, {"status": {"ok": 1}}, src=0))

    b_machine = Scripted(Received=answer)
    b = Loop(cfg(), b_machine, role="b")
    b.start()
    a_machine = Scripted(
        Submit=lambda e: [Connect(5, b.address, routing_id=rid, listen=True), Send(5, status(3))]
    )
    a = Loop(cfg(), a_machine, role="a")
    a.start()
    try:
        a.post(Submit("go"))
        wait_for(lambda: a_machine.of(Received))
        asked = b_machine.of(Received)[0]
        assert asked.routing_id == rid and asked.message.src == 3
        got = a_machine.of(Received)[0]
        assert got.via == 5 and got.routing_id is None and got.message["status"] == {"ok": 1}
    finally:
        a.stop()
        b.stop()


def test_a_droppable_send_to_a_full_queue_is_dropped_and_reported_back() -> None:
    relay = Message(Op.UPDATE, {"origin": 1, "seq": 1, "iteration": 0, "epoch": 0, "tau": 0.5,
                                "encoding": "sparse"}, [np.array([0, 8, 0, 0], np.int32)], src=1)

    def go(event):  # a connection nobody accepts: every frame waits in the overflow queue
        yield Connect(7, "127.0.0.1:9")
        for _ in range(12):
            yield Send(7, relay, droppable=True, count=3)

    machine = Scripted(Submit=go)
    loop = Loop(cfg(peer_queue_messages=2), machine, role="test")
    loop.start()
    try:
        loop.post(Submit("go"))
        dropped = loop.call(lambda: machine.of(Dropped))
        # zmq's own queue (SNDHWM) takes a few, the overflow queue 2, the rest are dropped
        assert dropped and set(dropped) == {Dropped(7, 3)} and loop.peer_dropped(7) == len(dropped)
        assert loop.call(lambda: len(loop.links.peers[7].pending)) == 2
    finally:
        loop.stop()


class Told:
    def __init__(self) -> None:
        self.count = 0

    def sent(self) -> None:
        self.count += 1


def test_a_download_travels_in_paced_pieces_and_arrives_whole() -> None:
    params = np.arange(50_000, dtype=np.float32)
    fields = {"request_id": 1, "dtype": "<f4", "size": params.size, "updater_dtype": None,
              "updater_size": 0, "watermark": {1: 2}, "extra_seen": {}}
    b_machine = Scripted()
    b = Loop(cfg(chunk_bytes=16 * 1024, max_header_bytes=64 * 1024), b_machine, role="b",
             params_nbytes=params.nbytes)
    b.start()
    told = Told()
    a_machine = Scripted(Submit=lambda e: [
        Connect(2, b.address),
        Download(2, Message(Op.PARAMS_REPLY, fields, [params], src=0), token=told),
    ])
    a = Loop(cfg(chunk_bytes=16 * 1024, max_header_bytes=64 * 1024), a_machine, role="a")
    a.start()
    try:
        a.post(Submit("go"))
        wait_for(lambda: b_machine.of(Received))
        got = b_machine.of(Received)[0].message
        assert got.op is Op.PARAMS_REPLY and got["watermark"] == {1: 2}
        assert np.array_equal(np.frombuffer(got.buffers[0], np.float32), params)
        assert len(b_machine.of(ChunkArrived)) == -(-params.nbytes // (16 * 1024))
        assert told.count == 1
    finally:
        a.stop()
        b.stop()


def test_a_machine_stops_the_loop_with_its_error() -> None:
    error = TransportError("the role gave up")
    machine = Scripted(Submit=lambda e: [Stop(error)])
    loop = Loop(cfg(), machine, role="test")
    loop.start()
    loop.post(Submit("give up"))
    with pytest.raises(TransportError, match="gave up"):
        loop.wait(10.0)
    assert not loop.running and loop.error is error
    assert not machine.of(Stopping)  # it stopped itself: no goodbyes asked for


def test_no_wake_is_lost_when_threads_wake_the_loop_while_it_drains() -> None:
    """Three threads queue work and wake a loop that polls with a 5 s timeout, 400 times each, while
    the loop drains the wake pipe: every piece of work is done within 2 s, i.e. no wake was lost to the
    poll's timeout. (Clearing the pipe's flag before taking its messages out could take a later wake's
    message with it: the flag stayed set, the pipe empty, and every later wake waited for the poll.)"""
    import queue
    import threading

    from psrv.transport.wake import WakePipe

    ctx = zmq.Context()
    pipe = WakePipe()
    pipe.open(ctx, "inproc://test-wake-pipe")
    poller = zmq.Poller()
    poller.register(pipe.pull, zmq.POLLIN)
    work: queue.Queue = queue.Queue()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            if pipe.pull in dict(poller.poll(5000)):
                pipe.drain()
            while not work.empty():
                work.get_nowait().set()

    late: list[int] = []

    def waker() -> None:
        for i in range(400):
            done = threading.Event()
            work.put(done)
            pipe.wake()
            if not done.wait(2.0):
                late.append(i)
                return

    looping = threading.Thread(target=loop, daemon=True)
    looping.start()
    wakers = [threading.Thread(target=waker, daemon=True) for _ in range(3)]
    for thread in wakers:
        thread.start()
    for thread in wakers:
        thread.join(30)
    stop.set()
    pipe.wake()
    looping.join(10)
    pipe.close()
    ctx.term()
    assert late == [], f"work waited for the poll's timeout after wakes {late}"


class _HeldSend:
    """A PUSH socket whose ``send`` waits for ``release`` (the real send then goes ahead): a wake held
    inside zmq, where another thread's close would free what it uses."""

    def __init__(self, sock: zmq.Socket) -> None:
        import threading

        self.sock = sock
        self.entered = threading.Event()
        self.release = threading.Event()
        self.sends: list[str] = []

    @property
    def closed(self) -> bool:
        return self.sock.closed

    def send(self, data: bytes, flags: int = 0) -> None:
        self.entered.set()
        assert self.release.wait(10.0)
        assert not self.sock.closed, "the socket was closed while a send was in it"
        self.sock.send(data, flags)
        self.sends.append("sent")

    def close(self, linger: int | None = None) -> None:
        self.sends.append("closed")
        self.sock.close(linger)


def test_the_wake_pipe_closes_only_after_a_send_in_flight_and_no_send_comes_after() -> None:
    """zmq sockets are not thread-safe: the loop closing the wake pipe while a caller thread's wake is
    inside ``send`` can crash the process. ``close()`` waits for that send, and a wake after it is a
    no-op (no send, no error)."""
    import threading

    from psrv.transport.wake import WakePipe

    ctx = zmq.Context()
    pipe = WakePipe()
    pipe.open(ctx, "inproc://test-wake-close")
    held = _HeldSend(pipe.push)
    pipe.push = held
    waker = threading.Thread(target=pipe.wake, daemon=True)
    waker.start()
    assert held.entered.wait(10.0)
    closer = threading.Thread(target=pipe.close, daemon=True)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() went ahead while a wake was inside send"
    held.release.set()
    waker.join(10.0)
    closer.join(10.0)
    assert not closer.is_alive() and held.sends == ["sent", "closed"]
    assert pipe.push is None and pipe.pull is None
    pipe._pending = False  # as after a drain: the next wake would send
    pipe.wake()
    assert held.sends == ["sent", "closed"]
    ctx.term()


def test_stop_says_so_when_the_io_thread_outlives_its_wait(caplog) -> None:
    """``stop(timeout_s)`` returns after its wait; an I/O thread still closing then is logged (a process
    that exits under it can crash inside zmq), and the loop still ends on its own afterwards."""
    machine = Scripted(Stopping=lambda e: time.sleep(1.0) or [])
    loop = Loop(cfg(), machine, role="test")
    loop.start()
    with caplog.at_level("WARNING", logger="psrv.transport.test"):
        loop.stop(0.1)
    assert any("still closing" in r.getMessage() for r in caplog.records), caplog.text
    assert loop.wait(10.0)
    caplog.clear()
    quick = Loop(cfg(), Scripted(), role="test")
    quick.start()
    with caplog.at_level("WARNING", logger="psrv.transport.test"):
        quick.stop()
    assert not quick.running and "still closing" not in caplog.text
    assert quick.stop_timeout_s() == pytest.approx(2 * 0.2 + 5.0)


def test_a_start_that_times_out_waits_for_its_io_thread_and_says_so_when_it_outlives_the_wait(caplog) -> None:
    """A loop that never becomes ready is stopped before ``start`` raises; the wait for its thread is
    ``stop_timeout_s()`` (it was a fixed 5 s, whatever the linger), and an outliving thread is logged."""
    machine = Scripted(Started=lambda e: [], Stopping=lambda e: time.sleep(1.0) or [])
    loop = Loop(cfg(), machine, role="test")
    loop.stop_timeout_s = lambda: 0.1
    with caplog.at_level("WARNING", logger="psrv.transport.test"), pytest.raises(NotRunningError):
        loop.start(timeout_s=0.2)
    assert any("still closing" in r.getMessage() and "start timed out" in r.getMessage()
               for r in caplog.records), caplog.text
    assert loop.wait(10.0)
    caplog.clear()
    slow = Scripted(Started=lambda e: [], Stopping=lambda e: time.sleep(0.5) or [])
    patient = Loop(cfg(), slow, role="test")
    with caplog.at_level("WARNING", logger="psrv.transport.test"), pytest.raises(NotRunningError):
        patient.start(timeout_s=0.2)
    assert not patient.running and "still closing" not in caplog.text  # ended within stop_timeout_s()
