"""Sparse messages built from indices (psrv.encoding.sparse_message) and the synthetic generator that
uses them: the same wire form the encoder writes, applied exactly by decode."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.encoding import decode, encode, message_info, sparse_message
from psrv.server.cli.synthetic import SyntheticUpdates


def test_a_message_built_from_indices_equals_the_encoders() -> None:
    n, tau = 10_000, 0.25
    rng = np.random.default_rng(3)
    indices = np.sort(rng.choice(n, 300, replace=False))
    negative = rng.random(300) < 0.5
    residual = np.zeros(n, dtype=np.float32)
    residual[indices] = np.where(negative, -tau, tau)
    expected = encode(residual.copy(), tau)
    built = sparse_message(indices, negative, n, tau)
    assert built.dtype == np.int32 and np.array_equal(built, expected)
    target = np.zeros(n, dtype=np.float32)
    decode(built, target)
    assert np.array_equal(target, residual)


@pytest.mark.parametrize(
    "indices, n",
    [([3, 2], 10), ([1, 1], 10), ([-1], 10), ([10], 10), (list(range(64)), 1000)],
)
def test_indices_that_do_not_form_a_sparse_message_are_refused(indices: list[int], n: int) -> None:
    with pytest.raises(ValueError):
        sparse_message(np.array(indices), np.zeros(len(indices), dtype=bool), n, 0.5)


def test_the_generator_draws_sparse_messages_of_the_asked_density_and_can_still_go_dense() -> None:
    n = 200_000
    gen = SyntheticUpdates(n, sparsity=0.001, threshold=1e-3, seed=7)
    for _ in range(5):
        info = message_info(gen.next_message())
        assert (info.form, info.count, info.n) == ("sparse", 200, n)
    dense = SyntheticUpdates(n, sparsity=0.001, seed=7, direct=False)
    assert message_info(dense.next_message()).n == n
    assert SyntheticUpdates(n, sparsity=0.5, seed=7).sparse is False  # denser than the sparse form holds
