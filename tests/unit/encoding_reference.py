"""A plain-NumPy reference of psrv's threshold encoding rules, for tests and the benchmark.

Written from the wire-format description only (not from the numba kernels), vectorized and obvious.
"""

from __future__ import annotations

import numpy as np

HEADER = 4


class ReferenceNonFinite(Exception):
    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


def tau_bits(tau32: np.float32) -> int:
    return int(np.array([tau32], dtype=np.float32).view(np.int32)[0])


def reference_encode(residual: np.ndarray, threshold: float) -> np.ndarray | None:
    """Encode in place like psrv.encoding.encode, the obvious NumPy way."""
    tau32 = np.float32(threshold)
    tau = residual.dtype.type(tau32)
    bad = np.flatnonzero(~np.isfinite(residual))
    if bad.size:
        raise ReferenceNonFinite(int(bad[0]))
    n = residual.size
    up = residual >= tau
    down = residual <= -tau
    hit = up | down
    count = int(np.count_nonzero(hit))
    if count == 0:
        return None
    residual[up] -= tau
    residual[down] += tau
    words = -(-n // 16)
    if count < words:
        index = np.flatnonzero(hit)
        signed = np.where(down[index], -(index + 1), index + 1)
        header = np.array([count, n, tau_bits(tau32), 0], dtype=np.int32)
        return np.concatenate([header, signed.astype(np.int32)])
    padded_hit = np.zeros(words * 16, dtype=np.int64)
    padded_down = np.zeros(words * 16, dtype=np.int64)
    padded_hit[:n] = hit
    padded_down[:n] = down
    weights = np.left_shift(1, np.arange(16, dtype=np.int64))
    value_bits = (padded_hit.reshape(words, 16) * weights).sum(axis=1)
    sign_bits = (padded_down.reshape(words, 16) * weights).sum(axis=1) << 16
    body = (value_bits | sign_bits).astype(np.uint32).view(np.int32)
    header = np.array([n, n, tau_bits(tau32), 1], dtype=np.int32)
    return np.concatenate([header, body])


def reference_decode(message: np.ndarray, target: np.ndarray, scale: float = 1.0) -> None:
    """Apply a valid message (no validation here) the obvious NumPy way."""
    n = int(message[1])
    tau = float(message[2:3].view(np.float32)[0])
    delta = target.dtype.type(np.float64(np.float32(tau)) * scale)
    if int(message[3]) == 0:
        signed = message[HEADER:].astype(np.int64)
        index = np.abs(signed) - 1
        target[index] += np.where(signed > 0, delta, -delta).astype(target.dtype)
    else:
        words = message[HEADER:].view(np.uint32).astype(np.int64)
        bits = np.arange(16, dtype=np.int64)
        has = ((words[:, None] >> bits) & 1).ravel()[:n].astype(bool)
        negative = ((words[:, None] >> (bits + 16)) & 1).ravel()[:n].astype(bool)
        target[has & ~negative] += delta
        target[has & negative] -= delta
