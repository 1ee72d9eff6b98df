"""psrv.encoding: threshold encoding of sparse updates (numba kernels), threshold algorithms and
residual post-processing. ``psrv.encoding.device`` is the same codec written with torch tensor ops (for
residuals and parameters on a GPU); it needs torch, so it is imported explicitly, not from here.

The numba kernel cache lives where ``PSRV_NUMBA_CACHE_DIR`` (or ``NUMBA_CACHE_DIR``) points; see
``psrv.encoding._numba_cache``.
"""

from __future__ import annotations

from psrv.encoding._kernels import load_all as preload_kernels
from psrv.encoding.codec import (
    MessageInfo,
    decode,
    encode,
    encode_counted,
    float32_threshold,
    message_info,
    sparse_message,
)
from psrv.encoding.errors import (
    EncodingError,
    InvalidStateError,
    MalformedMessageError,
    NonFiniteResidualError,
)
from psrv.encoding.postprocess import NoResidualPostProcessor, ResidualClipping, post_processor_from_state
from psrv.encoding.residual_encoder import ResidualEncoder
from psrv.encoding.stats import EncodingStats, encoding_stats
from psrv.encoding.thresholds import (
    AdaptiveThreshold,
    FixedThreshold,
    TargetSparsityThreshold,
    threshold_algorithm_from_state,
)

__all__ = [
    "AdaptiveThreshold",
    "EncodingError",
    "EncodingStats",
    "FixedThreshold",
    "InvalidStateError",
    "MalformedMessageError",
    "MessageInfo",
    "NoResidualPostProcessor",
    "NonFiniteResidualError",
    "ResidualClipping",
    "ResidualEncoder",
    "TargetSparsityThreshold",
    "decode",
    "encode",
    "encode_counted",
    "encoding_stats",
    "float32_threshold",
    "message_info",
    "post_processor_from_state",
    "preload_kernels",
    "sparse_message",
    "threshold_algorithm_from_state",
]
