"""Prefetching iterator and re-batching: plain objects, no Spark needed."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from psrv.nn.data import DataSet
from psrv.spark.data.batching import chunked, rebatch
from psrv.spark.errors import PrefetchTimeoutError, SparkConfigError, SparkInputError
from psrv.spark.task.prefetch import PrefetchingIterator

pytestmark = pytest.mark.timeout(30)


def _examples(n: int, width: int = 3) -> list[DataSet]:
    one_hot = np.eye(2, dtype=np.float32)
    return [DataSet(np.full((1, width), i, np.float32), one_hot[[i % 2]]) for i in range(n)]


@pytest.mark.parametrize("num_batches", [0, 1, 3])
def test_prefetch_yields_everything_in_order(num_batches: int) -> None:
    assert list(PrefetchingIterator(range(50), num_batches)) == list(range(50))


def test_prefetch_reads_ahead_at_most_queue_size() -> None:
    produced = []

    def source():
        for i in range(100):
            produced.append(i)
            yield i

    it = PrefetchingIterator(source(), 2)
    assert next(it) == 0
    time.sleep(0.3)
    # one consumed + 2 queued + 1 held by the blocked producer
    assert len(produced) <= 4
    it.close()


def test_prefetch_reraises_source_error() -> None:
    def source():
        yield 1
        raise RuntimeError("disk gone")

    it = PrefetchingIterator(source(), 2)
    assert next(it) == 1
    with pytest.raises(RuntimeError, match="disk gone"):
        next(it)


def test_prefetch_deadline_on_stuck_source() -> None:
    release = threading.Event()

    def source():
        yield 1
        release.wait(5)
        yield 2

    it = PrefetchingIterator(source(), 1, timeout_s=0.3)
    assert next(it) == 1
    started = time.monotonic()
    with pytest.raises(PrefetchTimeoutError, match="0.3 s"):
        next(it)
    assert time.monotonic() - started < 2
    release.set()


def test_prefetch_counts_waiting_time() -> None:
    def slow():
        for i in range(3):
            time.sleep(0.05)
            yield i

    it = PrefetchingIterator(slow(), 1)
    assert list(it) == [0, 1, 2]
    assert it.wait_seconds > 0.05


def test_prefetch_rejects_bad_size() -> None:
    with pytest.raises(SparkConfigError, match="worker_prefetch_num_batches"):
        PrefetchingIterator([], -1)


def test_rebatch_exact_sizes_and_order() -> None:
    batches = list(rebatch(_examples(10), 4))
    assert [b.num_examples for b in batches] == [4, 4, 2]
    assert np.concatenate([b.features[:, 0] for b in batches]).tolist() == list(range(10))


def test_rebatch_splits_large_datasets() -> None:
    big = DataSet.merge(_examples(7))
    batches = list(rebatch([big, *_examples(2)], 3))
    assert [b.num_examples for b in batches] == [3, 3, 3]


def test_chunked_keeps_order_and_yields_a_short_last_chunk() -> None:
    assert list(chunked(iter(range(7)), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(chunked([], 3)) == []


def test_rebatch_rejects_foreign_elements() -> None:
    with pytest.raises(SparkInputError, match="got int"):
        list(rebatch([1, 2], 2))


def test_residual_carried_once_per_session() -> None:
    from psrv.spark.task.worker import keep_residual, take_residual

    keep_residual("a", np.ones(3, np.float32))
    keep_residual("b", np.full(3, 2.0, np.float32))  # a new master replaces the old one's residual
    assert take_residual("a") is None
    np.testing.assert_array_equal(take_residual("b"), np.full(3, 2.0, np.float32))
    assert take_residual("b") is None  # taken once
