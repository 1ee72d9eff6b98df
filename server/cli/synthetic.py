"""Synthetic updates for `psrv node`: random sparse encoded messages at the cost of their size.

A message touching a fraction ``sparsity`` of the parameters is drawn directly as sorted indices and
signs and written in the encoding package's sparse wire form (``psrv.encoding.sparse_message``): the
cost is proportional to the update, not to the model, so one machine can emulate many fast workers
of a large model (drawing and encoding a dense 11 M-element residual capped a node at ~3 updates/s).
Above the sparse form's density (1/16 of the elements) the dense path through the real residual
encoder is used, as before.
"""

from __future__ import annotations

import numpy as np
from psrv.encoding import FixedThreshold, ResidualEncoder, decode, sparse_message
from psrv.encoding.update_header import bitmap_words


class SyntheticUpdates:
    """Each step touches ~``sparsity`` x size random elements with +-threshold."""

    def __init__(
        self,
        size: int,
        *,
        sparsity: float = 0.05,
        threshold: float = 1e-3,
        scale: float | None = None,
        seed: int | None = None,
        direct: bool = True,
    ) -> None:
        if not 0.0 < sparsity <= 1.0:
            raise ValueError(f"sparsity must be in (0, 1], got {sparsity}")
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self.sparsity = sparsity
        self.threshold = threshold
        self.scale = threshold if scale is None else scale
        self.rng = np.random.default_rng(seed)
        self.count = max(1, round(sparsity * size))
        self.sparse = direct and self.count < bitmap_words(size)  # direct=False: the dense path (benchmarks)
        self.encoder = None if self.sparse else ResidualEncoder(
            size, threshold_algorithm=FixedThreshold(threshold)
        )

    def warm_up(self) -> None:
        """Compile the encoding kernels now (numba), not while the node must keep its heartbeats."""
        scratch = ResidualEncoder(self.size, threshold_algorithm=FixedThreshold(1.0))
        message = scratch.encode_update(np.full(self.size, 2.0, dtype=np.float32))
        decode(message, np.zeros(self.size, dtype=np.float32))
        sparse = scratch.encode_update(np.eye(1, self.size, dtype=np.float32)[0] * 2.0)
        if sparse is not None:
            decode(sparse, np.zeros(self.size, dtype=np.float32))

    def next_message(self, max_tries: int = 1000) -> np.ndarray:
        """The next non-empty encoded message."""
        if self.sparse:
            indices = np.sort(self.rng.choice(self.size, self.count, replace=False, shuffle=False))
            negative = self.rng.random(self.count) < 0.5
            return sparse_message(indices, negative, self.size, self.threshold)
        for _ in range(max_tries):  # dense: through the residual encoder (steps below tau are folded in)
            mask = self.rng.random(self.size) < self.sparsity
            update = (self.rng.standard_normal(self.size) * self.scale * mask).astype(np.float32)
            message = self.encoder.encode_update(update)
            if message is not None:
                return message
        raise RuntimeError(f"no update reached the threshold in {max_tries} steps")


__all__ = ["SyntheticUpdates"]
