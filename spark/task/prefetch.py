"""A prefetching iterator: a background thread reads ahead into a bounded queue.

Loading the next minibatch (reading a file, decoding, converting a Spark row) overlaps with
training on the current one. Every wait has a deadline, so a stuck data source turns into a
:class:`PrefetchTimeoutError` instead of a hung task, and the reader thread stops when the
consumer closes the iterator early.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from psrv.spark.errors import PrefetchTimeoutError, SparkConfigError

T = TypeVar("T")

_END = object()
DEFAULT_TIMEOUT_S = 300.0
_POLL_S = 0.1


def check_prefetch_num_batches(num_batches: object) -> int:
    if not isinstance(num_batches, int) or num_batches < 0:
        raise SparkConfigError(f"worker_prefetch_num_batches: expected an int >= 0, got {num_batches!r}")
    return num_batches


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class PrefetchingIterator(Generic[T]):
    """Iterates ``source`` with up to ``num_batches`` items read ahead by a daemon thread.

    ``num_batches == 0`` reads synchronously (no thread). ``timeout_s`` bounds the wait for
    any single item. ``wait_seconds`` accumulates the time the consumer spent waiting for data
    (the "waiting for data" figure of the training statistics).
    """

    def __init__(
        self,
        source: Iterable[T],
        num_batches: int = 2,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_prefetch_num_batches(num_batches)
        if timeout_s <= 0:
            raise SparkConfigError(f"prefetch timeout_s: expected > 0, got {timeout_s!r}")
        self._source = iter(source)
        self._timeout_s = float(timeout_s)
        self._clock = clock
        self._closed = threading.Event()
        self._done = False
        self.wait_seconds = 0.0
        self.items = 0
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        if num_batches > 0:
            self._queue = queue.Queue(maxsize=num_batches)
            self._thread = threading.Thread(target=self._read_ahead, name="psrv-prefetch", daemon=True)
            self._thread.start()

    def _put(self, item: object) -> bool:
        assert self._queue is not None
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _read_ahead(self) -> None:
        try:
            for item in self._source:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as exc:  # handed to the consumer, re-raised there
            self._put(_Failure(exc))

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        started = self._clock()
        try:
            item = next(self._source, _END) if self._queue is None else self._get(started)
        finally:
            self.wait_seconds += self._clock() - started
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            self.close()
            raise item.error
        self.items += 1
        return item  # type: ignore[return-value]

    def _get(self, started: float) -> object:
        assert self._queue is not None
        deadline = started + self._timeout_s
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                self.close()
                raise PrefetchTimeoutError(
                    f"no minibatch from the data source within {self._timeout_s:.1f} s "
                    f"(after {self.items} minibatches)"
                )
            try:
                return self._queue.get(timeout=min(remaining, _POLL_S * 10))
            except queue.Empty:
                if self._thread is not None and not self._thread.is_alive() and self._queue.empty():
                    return _END

    def close(self) -> None:
        """Stop reading ahead; the reader thread exits at its next put."""
        self._closed.set()
        self._done = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def __enter__(self) -> PrefetchingIterator[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DEFAULT_TIMEOUT_S", "PrefetchingIterator", "check_prefetch_num_batches"]
