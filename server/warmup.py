"""What a role checks and prepares before its I/O thread runs: the parameter vector's form, its
checksum, and the decode kernels compiled (or loaded from numba's cache)."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
from psrv.transport.errors import TransportConfigError

__all__ = ["DECODE_KERNELS", "check_params", "params_checksum", "warm_up_decode"]

DECODE_KERNELS = ("validate_sparse", "validate_bitmap", "apply_sparse", "apply_bitmap", "unpack_packed")


def check_params(params: np.ndarray) -> np.ndarray:
    if (
        not isinstance(params, np.ndarray)
        or params.ndim != 1
        or params.dtype.kind != "f"
        or not params.flags.c_contiguous
        or not params.flags.writeable
    ):
        desc = (
            f"{params.dtype}{list(params.shape)} contiguous={params.flags.c_contiguous}"
            if isinstance(params, np.ndarray)
            else type(params).__name__
        )
        raise TransportConfigError(
            f"params must be a writeable 1-D C-contiguous float32/float64 array, got {desc}"
        )
    return params


def params_checksum(params: np.ndarray) -> dict[str, Any]:
    """Sum (tolerant to rounding order) and crc32 (exact bytes) of a parameter vector."""
    return {
        "params_sum": float(np.sum(params, dtype=np.float64)),
        "params_abs_sum": float(np.sum(np.abs(params), dtype=np.float64)),
        "params_crc32": zlib.crc32(memoryview(params).cast("B")) & 0xFFFFFFFF,
    }


def warm_up_decode(dtype: np.dtype) -> None:
    """Compile (or load from numba's cache) every kernel the I/O thread calls, before it runs: a
    first sparse decode compiling inside the I/O thread froze a node for 2 s under load (it was
    evicted). Each wire form is decoded once, so any first-call cost is paid here too."""
    from psrv.encoding import _kernels, compact, decode, encode  # lazy: numba compiles the kernels on import

    for name in DECODE_KERNELS:
        _ = getattr(_kernels, name).dispatcher  # every explicit signature, all float dtypes
    dense = np.ones(32, dtype=dtype)  # every element at the threshold: the bitmap form
    sparse = np.zeros(4096, dtype=dtype)  # one element: the sparse form
    sparse[7] = 1.0
    spread = np.zeros(4096, dtype=dtype)  # 41 elements: compact packs them (the form updates travel in)
    spread[::100] = 1.0
    for vector in (dense, sparse, spread):
        message = encode(vector.copy(), 0.5)
        decode(message, np.zeros(vector.size, dtype=dtype))
        decode(compact(message), np.zeros(vector.size, dtype=dtype))
