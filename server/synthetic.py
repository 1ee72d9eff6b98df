"""Synthetic updates for `psrv node`: random sparse vectors through the real encoder and residual."""

from __future__ import annotations

import numpy as np
from psrv.encoding import FixedThreshold, ResidualEncoder


class SyntheticUpdates:
    """Each step draws N(0, scale) on a random fraction ``sparsity`` of the parameters and encodes it."""

    def __init__(
        self,
        size: int,
        *,
        sparsity: float = 0.05,
        threshold: float = 1e-3,
        scale: float | None = None,
        seed: int | None = None,
    ) -> None:
        if not 0.0 < sparsity <= 1.0:
            raise ValueError(f"sparsity must be in (0, 1], got {sparsity}")
        self.size = size
        self.sparsity = sparsity
        self.scale = threshold if scale is None else scale
        self.rng = np.random.default_rng(seed)
        self.encoder = ResidualEncoder(size, threshold_algorithm=FixedThreshold(threshold))

    def warm_up(self) -> None:
        """Compile the encoding kernels now (numba), not while the node must keep its heartbeats."""
        from psrv.encoding import decode

        scratch = ResidualEncoder(self.size, threshold_algorithm=FixedThreshold(1.0))
        message = scratch.encode_update(np.full(self.size, 2.0, dtype=np.float32))
        decode(message, np.zeros(self.size, dtype=np.float32))
        sparse = scratch.encode_update(np.eye(1, self.size, dtype=np.float32)[0] * 2.0)
        if sparse is not None:
            decode(sparse, np.zeros(self.size, dtype=np.float32))

    def next_message(self, max_tries: int = 1000) -> np.ndarray:
        """The next non-empty encoded message (steps whose residual stays below tau are folded in)."""
        for _ in range(max_tries):
            mask = self.rng.random(self.size) < self.sparsity
            update = (self.rng.standard_normal(self.size) * self.scale * mask).astype(np.float32)
            message = self.encoder.encode_update(update)
            if message is not None:
                return message
        raise RuntimeError(f"no update reached the threshold in {max_tries} steps")
