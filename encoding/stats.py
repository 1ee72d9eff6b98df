"""Debug statistics of one encoding step: how the residual compares with tau."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from psrv.encoding.codec import float32_threshold

PERCENTILES = (50.0, 95.0, 99.0, 99.9)


@dataclass(frozen=True)
class EncodingStats:
    """|r| of the residual about to be encoded, against tau (as float32, the value the encoder uses)."""

    tau: float
    n: int
    count: int  # elements with |r| >= tau: what the step emits
    sparsity: float  # count / n
    mean_abs: float
    max_abs: float
    percentiles: dict[float, float]  # percentile -> |r|
    percentiles_in_tau: dict[float, float]  # percentile -> |r| / tau

    def to_dict(self) -> dict:
        """JSON-able (percentile keys as strings)."""
        d = asdict(self)
        d["percentiles"] = {str(k): v for k, v in self.percentiles.items()}
        d["percentiles_in_tau"] = {str(k): v for k, v in self.percentiles_in_tau.items()}
        return d

    def __str__(self) -> str:
        p = ", ".join(f"p{k:g}={v:.3g} ({self.percentiles_in_tau[k]:.3g} tau)"
                      for k, v in self.percentiles.items())
        return (f"tau={self.tau:.4g} count={self.count}/{self.n} sparsity={self.sparsity:.3g} "
                f"mean|r|={self.mean_abs:.3g} max|r|={self.max_abs:.3g} {p}")


def encoding_stats(residual: np.ndarray, threshold: float) -> EncodingStats:
    """Statistics of `residual` (before encoding) against `threshold`; a few passes, so for debugging."""
    tau = float(float32_threshold(threshold))
    residual = np.asarray(residual)
    n = int(residual.size)
    if n == 0:
        empty = {p: 0.0 for p in PERCENTILES}
        return EncodingStats(tau, 0, 0, 0.0, 0.0, 0.0, empty, dict(empty))
    magnitude = np.abs(residual.ravel()).astype(np.float64)
    count = int(np.count_nonzero(magnitude >= residual.dtype.type(tau)))
    values = np.percentile(magnitude, PERCENTILES)
    percentiles = {p: float(v) for p, v in zip(PERCENTILES, values, strict=True)}
    return EncodingStats(
        tau=tau, n=n, count=count, sparsity=count / n, mean_abs=float(magnitude.mean()),
        max_abs=float(magnitude.max()), percentiles=percentiles,
        percentiles_in_tau={p: v / tau for p, v in percentiles.items()},
    )


__all__ = [
    "PERCENTILES",
    "EncodingStats",
    "encoding_stats",
]
