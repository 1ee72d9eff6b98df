"""psrv.encoding: threshold encoding of sparse updates (numba kernels), threshold algorithms and
residual post-processing. ``psrv.encoding.device`` is the same codec written with torch tensor ops (for
residuals and parameters on a GPU); it needs torch, so it is imported explicitly, not from here.

The numba kernel cache lives where ``PSRV_NUMBA_CACHE_DIR`` (or ``NUMBA_CACHE_DIR``) points; see
``psrv.encoding._numba_cache``.

The names below load their module on first use, so importing ``psrv.encoding.update_header`` (what
the transport asks about an update's header) or ``psrv.encoding.errors`` does not import numba.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from psrv.encoding.errors import (
    EncodingError,
    InvalidStateError,
    MalformedMessageError,
    NonFiniteResidualError,
)

if TYPE_CHECKING:
    from psrv.encoding._kernels import load_all as preload_kernels
    from psrv.encoding.codec import encode, encode_counted, float32_threshold, sparse_message
    from psrv.encoding.implicit_residual import ImplicitResidual
    from psrv.encoding.messages import (
        MessageInfo,
        compact,
        decode,
        decode_validated,
        message_info,
        parse_message,
    )
    from psrv.encoding.postprocess import NoResidualPostProcessor, ResidualClipping, post_processor_from_state
    from psrv.encoding.residual_encoder import ResidualEncoder
    from psrv.encoding.stats import EncodingStats, encoding_stats
    from psrv.encoding.strategies import ResidualPostProcessor, ThresholdAlgorithm
    from psrv.encoding.thresholds import (
        AdaptiveThreshold,
        FixedThreshold,
        SampledQuantileThreshold,
        TargetSparsityThreshold,
        dl4j_threshold,
        shared_training_threshold,
        threshold_algorithm_from_state,
    )

#: public name -> (module, name in it), imported on first access
_LAZY: dict[str, tuple[str, str]] = {
    "preload_kernels": ("psrv.encoding._kernels", "load_all"),
    **{name: ("psrv.encoding.codec", name) for name in (
        "encode", "encode_counted", "float32_threshold", "sparse_message",
    )},
    **{name: ("psrv.encoding.messages", name) for name in (
        "MessageInfo", "compact", "decode", "decode_validated", "message_info", "parse_message",
    )},
    **{name: ("psrv.encoding.postprocess", name) for name in (
        "NoResidualPostProcessor", "ResidualClipping", "post_processor_from_state",
    )},
    "ResidualEncoder": ("psrv.encoding.residual_encoder", "ResidualEncoder"),
    "ImplicitResidual": ("psrv.encoding.implicit_residual", "ImplicitResidual"),
    "EncodingStats": ("psrv.encoding.stats", "EncodingStats"),
    "encoding_stats": ("psrv.encoding.stats", "encoding_stats"),
    "ThresholdAlgorithm": ("psrv.encoding.strategies", "ThresholdAlgorithm"),
    "ResidualPostProcessor": ("psrv.encoding.strategies", "ResidualPostProcessor"),
    **{name: ("psrv.encoding.thresholds", name) for name in (
        "AdaptiveThreshold", "FixedThreshold", "TargetSparsityThreshold", "threshold_algorithm_from_state",
    )},
    "SampledQuantileThreshold": ("psrv.encoding.thresholds", "SampledQuantileThreshold"),
    "dl4j_threshold": ("psrv.encoding.thresholds", "dl4j_threshold"),
    "shared_training_threshold": ("psrv.encoding.thresholds", "shared_training_threshold"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:  # also how ``from psrv.encoding import <submodule>`` finds submodules
        raise AttributeError(f"module 'psrv.encoding' has no attribute {name!r}")
    # lazy: importing psrv.encoding (the transport does, for update_header) must not load numba
    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AdaptiveThreshold",
    "EncodingError",
    "EncodingStats",
    "FixedThreshold",
    "ImplicitResidual",
    "InvalidStateError",
    "MalformedMessageError",
    "MessageInfo",
    "NoResidualPostProcessor",
    "NonFiniteResidualError",
    "ResidualClipping",
    "ResidualEncoder",
    "ResidualPostProcessor",
    "SampledQuantileThreshold",
    "TargetSparsityThreshold",
    "ThresholdAlgorithm",
    "compact",
    "decode",
    "decode_validated",
    "dl4j_threshold",
    "encode",
    "encode_counted",
    "encoding_stats",
    "float32_threshold",
    "message_info",
    "parse_message",
    "post_processor_from_state",
    "preload_kernels",
    "shared_training_threshold",
    "sparse_message",
    "threshold_algorithm_from_state",
]
