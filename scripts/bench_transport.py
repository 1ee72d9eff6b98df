"""Benchmark psrv's transport against raw pyzmq on loopback, in the same run.

1. Throughput: a node sends update messages of 4 KB, 64 KB, 1 MB and 16 MB to the controller (a
   receiver in another process); beside it raw pyzmq PUSH/PULL sends the same frames. Messages/s,
   GB/s, and the psrv/raw ratio (median of the repeats).
2. Small-message round trip: node A -> node B -> node A through psrv (MESH chain, B echoes),
   beside a raw DEALER/ROUTER echo of the same frames (median).
3. A controller relaying one sender's 64 KB updates to 1, 4 and 8 receiving nodes: messages/s
   each receiver got, and the aggregate GB/s out of the controller.

Every psrv message is a real, validated encoded update (bitmap form) for a model of the matching
size; receivers count arrivals without decoding, so the figures are the transport's.

    .venv/bin/python scripts/bench_transport.py                    # full run (a few minutes)
    .venv/bin/python scripts/bench_transport.py --quick            # small sizes, fewer messages
    .venv/bin/python scripts/bench_transport.py --throughput-only  # part 1 only (the not-slower check)

The last line says whether every size of 64 KB and up reached 0.8x raw pyzmq in this run.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import zmq
from psrv.encoding.update_header import BITMAP, HEADER_WORDS, WORD_ELEMENTS
from psrv.server import Controller, Node
from psrv.transport import TransportConfig
from psrv.transport.client import request_status
from psrv.transport.loop import ZERO_COPY_MIN_BYTES
from psrv.transport.messages import PROTOCOL_VERSION

KB = 1024
MB = 1024 * KB
BLOCK_PAUSE_S = 0.3
TARGET_RATIO = 0.8  # the target: psrv / raw pyzmq at 64 KB and up


def bitmap_message(total_bytes: int) -> np.ndarray:
    """A valid bitmap-form encoded update of exactly ``total_bytes`` (every element +tau)."""
    words = total_bytes // 4 - HEADER_WORDS
    n = words * WORD_ELEMENTS
    message = np.empty(HEADER_WORDS + words, dtype=np.int32)
    tau_bits = np.array([1e-3], dtype=np.float32).view(np.int32)[0]
    message[:HEADER_WORDS] = (n, n, tau_bits, BITMAP)
    message[HEADER_WORDS:] = 0x0000FFFF
    return message


def raw_header() -> bytes:
    return msgpack.packb(
        {
            "v": PROTOCOL_VERSION,
            "op": "update",
            "src": 1,
            "origin": 1,
            "seq": 1,
            "iteration": 0,
            "epoch": 0,
            "tau": 1e-3,
            "encoding": "bitmap",
        }
    )


def bench_config(**kw) -> TransportConfig:
    """Deep queues (no drop-and-resync in the measurement) and a patient heartbeat for a busy box."""
    return TransportConfig(heartbeat_s=1.0, missed_beats=10, peer_queue_messages=20_000, **kw)


# ----------------------------------------------------------------------------- receiver processes
class BlockClock:
    """Counts arrivals; after each block of ``block`` messages prints first/last arrival times."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.count = 0
        self.first = 0.0

    def arrived(self) -> None:
        now = time.time()
        if self.count == 0:
            self.first = now
        self.count += 1
        if self.count == self.block:
            print(json.dumps({"first": self.first, "last": now, "count": self.count}), flush=True)
            self.count = 0


def role_raw_pull(args: argparse.Namespace) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(f"ready 127.0.0.1:{port}", flush=True)
    clock = BlockClock(args.block)
    while True:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 1:
            break
        clock.arrived()


def role_raw_echo(args: argparse.Namespace) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(f"ready 127.0.0.1:{port}", flush=True)
    while True:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 2:
            break
        sock.send_multipart(frames, copy=False)


def role_controller(args: argparse.Namespace) -> None:
    clock = BlockClock(args.block)
    controller = Controller(
        bench_config(mesh=args.mesh, fan_out=args.fan_out),
        np.zeros(args.n, np.float32),
        apply=lambda payload, header: clock.arrived() if args.count else None,
    ).start()
    print(f"ready {controller.address}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    controller.stop()


def role_node(args: argparse.Namespace) -> None:
    clock = BlockClock(args.block)
    holder: dict[str, Node] = {}

    def on_update(payload: np.ndarray, header: dict) -> None:
        if args.echo:
            holder["node"].submit(payload, iteration=header["iteration"])
        else:
            clock.arrived()

    node = Node(bench_config(), np.zeros(args.n, np.float32), args.controller, apply=on_update)
    holder["node"] = node
    node.start()
    print(f"ready {node.address}", flush=True)
    sys.stdin.read()
    node.stop()


# ----------------------------------------------------------------------------- orchestration
class Child:
    def __init__(self, *role_args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, __file__, *role_args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self.popen.stdout.readline().strip()
        if not line.startswith("ready "):
            self.close()
            raise RuntimeError(f"benchmark child {role_args} failed to start: {line!r}")
        self.address = line.split()[1]
        self.lines: queue.Queue[str] = queue.Queue()  # a thread reads: select() cannot see buffered lines
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.popen.stdout:
            self.lines.put(line)

    def blocks(self, count: int, timeout_s: float = 120.0) -> list[dict]:
        """The next ``count`` block reports; a receiver that never completes a block fails the run."""
        out = []
        for _ in range(count):
            try:
                out.append(json.loads(self.lines.get(timeout=timeout_s)))
            except queue.Empty:
                raise RuntimeError(
                    f"no block report within {timeout_s} s (updates lost or a child hung)"
                ) from None
        return out

    def close(self) -> None:
        try:
            if self.popen.stdin:
                self.popen.stdin.close()
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


def block_rate(block: dict) -> float:
    """Messages/s of one block: (count - 1) intervals between its first and last arrival."""
    return (block["count"] - 1) / max(block["last"] - block["first"], 1e-9)


def throughput(size: int, count: int, repeats: int) -> dict:
    """Raw and psrv blocks alternate, so a change of the machine's load hits both alike."""
    message = bitmap_message(size)
    n = int(message[1])
    frames = [raw_header(), message]
    raw = Child("--role", "raw-pull", "--block", str(count))
    ctrl = Child("--role", "controller", "--block", str(count), "--n", str(n), "--count")
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.sndhwm = 1000
    push.connect(f"tcp://{raw.address}")
    raw_rates, psrv_rates = [], []
    try:
        node = Node(bench_config(), np.zeros(n, np.float32), ctrl.address).start()
        try:
            for _ in range(repeats):
                for _ in range(count):  # the same copy policy psrv uses (the faster one for each size)
                    push.send_multipart(frames, copy=size < ZERO_COPY_MIN_BYTES)
                raw_rates.append(block_rate(raw.blocks(1)[0]))
                for _ in range(count):
                    node.submit(message)
                psrv_rates.append(block_rate(ctrl.blocks(1)[0]))
        finally:
            node.stop()
        push.send(b"bye")
    finally:
        push.close(linger=2000)
        context.term()
        raw.close()
        ctrl.close()
    raw_mps, psrv_mps = statistics.median(raw_rates), statistics.median(psrv_rates)
    ratio = statistics.median(p / r for p, r in zip(psrv_rates, raw_rates, strict=True))
    return {
        "size": size,
        "messages": count,
        "repeats": repeats,
        "raw_msgs_s": raw_mps,
        "raw_gb_s": raw_mps * size / 1e9,
        "psrv_msgs_s": psrv_mps,
        "psrv_gb_s": psrv_mps * size / 1e9,
        "ratio": ratio,
    }


def round_trip(pings: int) -> dict:
    frames = [raw_header(), bitmap_message(64)]
    echo = Child("--role", "raw-echo")
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.connect(f"tcp://{echo.address}")
    raw = []
    try:
        for _ in range(pings):
            t0 = time.perf_counter()
            sock.send_multipart(frames)
            sock.recv_multipart()
            raw.append(time.perf_counter() - t0)
        sock.send_multipart([b"bye"])
    finally:
        sock.close(linger=1000)
        context.term()
        echo.close()
    message = bitmap_message(64)
    n = int(message[1])
    ctrl = Child("--role", "controller", "--n", str(n), "--mesh", "mesh", "--fan-out", "1")
    got = threading.Event()
    expected = {"iteration": -1}

    def on_update(payload: np.ndarray, header: dict) -> None:
        if header["iteration"] == expected["iteration"]:
            got.set()

    psrv = []
    try:
        node = Node(bench_config(), np.zeros(n, np.float32), ctrl.address, apply=on_update).start()
        peer = Child("--role", "node", "--controller", ctrl.address, "--n", str(n), "--echo")
        try:
            for i in range(pings):
                got.clear()
                expected["iteration"] = i
                t0 = time.perf_counter()
                node.submit(message, iteration=i)
                if not got.wait(5.0):
                    raise RuntimeError(f"no echo for ping {i}")
                psrv.append(time.perf_counter() - t0)
        finally:
            node.stop()
            peer.close()
    finally:
        ctrl.close()
    raw_us, psrv_us = statistics.median(raw) * 1e6, statistics.median(psrv) * 1e6
    return {"pings": pings, "raw_us": raw_us, "psrv_us": psrv_us, "ratio": raw_us / psrv_us}


def relay(receivers: int, size: int, count: int, repeats: int) -> dict:
    message = bitmap_message(size)
    n = int(message[1])
    ctrl = Child("--role", "controller", "--n", str(n))
    children: list[Child] = []
    try:
        children = [
            Child("--role", "node", "--controller", ctrl.address, "--n", str(n), "--block", str(count))
            for _ in range(receivers)
        ]
        node = Node(bench_config(), np.zeros(n, np.float32), ctrl.address).start()
        try:
            deadline = time.monotonic() + 30
            while len(request_status(ctrl.address)["nodes"]) < receivers + 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            for _ in range(repeats):
                for _ in range(count):
                    node.submit(message)
                time.sleep(BLOCK_PAUSE_S)
            blocks = [child.blocks(repeats) for child in children]
        finally:
            node.stop()
    finally:
        for child in children:
            child.close()
        ctrl.close()
    per_repeat = []
    for r in range(repeats):
        first = min(b[r]["first"] for b in blocks)
        last = max(b[r]["last"] for b in blocks)
        per_repeat.append(count / max(last - first, 1e-9))
    mps = statistics.median(per_repeat)
    return {
        "receivers": receivers,
        "size": size,
        "msgs_s_each": mps,
        "aggregate_gb_s": mps * size * receivers / 1e9,
    }


def more_figures(args: argparse.Namespace, repeats: int, results: dict) -> None:
    """Parts 2 and 3: the small-message round trip and the controller relaying to 1, 4 (and 8) nodes."""
    rt = round_trip(200 if args.quick else 1000)
    results["round_trip"] = rt
    print(
        f"\nsmall-message round trip (64 B update, median of {rt['pings']}): "
        f"raw pyzmq {rt['raw_us']:.0f} us, "
        f"psrv node->node->node {rt['psrv_us']:.0f} us (raw / psrv = {rt['ratio']:.2f})",
        flush=True,
    )
    print(
        "\n| controller relaying 64 KB updates to | msgs/s each receiver got | aggregate GB/s out | "
        "vs raw 1-hop msgs/s |"
    )
    print("|---|---|---|---|")
    raw64 = next(r["raw_msgs_s"] for r in results["throughput"] if r["size"] == 64 * KB)
    for receivers in [1, 4] + ([] if args.quick else [8]):
        r = relay(receivers, 64 * KB, 400 if args.quick else 1000, repeats)
        results["relay"].append(r)
        print(
            f"| {receivers} node(s) | {r['msgs_s_each']:,.0f} | {r['aggregate_gb_s']:.2f} | "
            f"{r['msgs_s_each'] / raw64:.2f}x |",
            flush=True,
        )


def human(size: int) -> str:
    return f"{size // MB} MB" if size >= MB else f"{size // KB} KB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4 KB..1 MB only, fewer messages and receivers")
    parser.add_argument(
        "--repeats", type=int, default=5, help="repeats per measurement (the median is shown)"
    )
    parser.add_argument("--json", action="store_true", help="also print every figure as one JSON document")
    parser.add_argument(
        "--throughput-only", action="store_true", help="only the throughput table (no round trip, no relay)"
    )
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--block", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--controller", help=argparse.SUPPRESS)
    parser.add_argument("--mesh", default="plain", help=argparse.SUPPRESS)
    parser.add_argument("--fan-out", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument("--count", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    roles = {
        "raw-pull": role_raw_pull,
        "raw-echo": role_raw_echo,
        "controller": role_controller,
        "node": role_node,
    }
    if args.role:
        roles[args.role](args)
        return 0

    repeats = 3 if args.quick else args.repeats
    sizes = [4 * KB, 64 * KB, MB] + ([] if args.quick else [16 * MB])
    budget = (32 if args.quick else 128) * MB
    results: dict = {"throughput": [], "relay": []}
    print(
        f"# psrv transport vs raw pyzmq on loopback (median of {repeats}); "
        f"python {sys.version.split()[0]}, zmq {zmq.zmq_version()}"
    )
    print(
        "| message | raw pyzmq msgs/s | raw GB/s | psrv msgs/s | psrv GB/s | psrv / raw (median of pairs) |"
    )
    print("|---|---|---|---|---|---|")
    for size in sizes:
        count = int(max(20, min(2000 if args.quick else 5000, budget // size)))
        r = throughput(size, count, repeats)
        results["throughput"].append(r)
        print(
            f"| {human(size)} | {r['raw_msgs_s']:,.0f} | {r['raw_gb_s']:.2f} | {r['psrv_msgs_s']:,.0f} | "
            f"{r['psrv_gb_s']:.2f} | {r['ratio']:.2f}x |",
            flush=True,
        )
    large = [r for r in results["throughput"] if r["size"] >= 64 * KB]
    worst = min(large, key=lambda r: r["ratio"])
    met = worst["ratio"] >= TARGET_RATIO
    results["target"] = {"ratio": TARGET_RATIO, "worst_64kb_up": worst["ratio"], "met": met}
    print(
        f"\n64 KB and up: lowest psrv / raw {worst['ratio']:.2f}x ({human(worst['size'])}); "
        f"target >= {TARGET_RATIO}x {'met' if met else 'NOT met'} in this run",
        flush=True,
    )
    if not args.throughput_only:
        more_figures(args, repeats, results)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
