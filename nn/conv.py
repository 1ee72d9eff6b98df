"""im2col / col2im for NCHW images: convolution and pooling become one BLAS matrix product each.

The only Python loops run over kernel offsets (kh * kw iterations), never over pixels or examples.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def output_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def windows(x: np.ndarray, kh: int, kw: int, stride: int, pad: int) -> np.ndarray:
    """A strided view (N, C, OH, OW, kh, kw) of every kernel window of x (N, C, H, W); no copy."""
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    view = sliding_window_view(x, (kh, kw), axis=(2, 3))
    return view[:, :, ::stride, ::stride]


def im2col(x: np.ndarray, kh: int, kw: int, stride: int, pad: int) -> np.ndarray:
    """Rows = output pixels (N*OH*OW), columns = (C, kh, kw) of the window: a C-contiguous matrix."""
    win = windows(x, kh, kw, stride, pad)
    n, c, oh, ow = win.shape[:4]
    return np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(n * oh * ow, c * kh * kw)


def col2im(
    cols: np.ndarray, x_shape: tuple[int, ...], kh: int, kw: int, stride: int, pad: int
) -> np.ndarray:
    """Adjoint of im2col: sums every window's column back into an image of x_shape (N, C, H, W)."""
    n, c, h, w = x_shape
    oh, ow = output_size(h, kh, stride, pad), output_size(w, kw, stride, pad)
    blocks = cols.reshape(n, oh, ow, c, kh, kw).transpose(0, 3, 4, 5, 1, 2)  # (N, C, kh, kw, OH, OW)
    out = np.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=cols.dtype)
    h_span, w_span = stride * (oh - 1) + 1, stride * (ow - 1) + 1
    for i in range(kh):
        for j in range(kw):
            out[:, :, i : i + h_span : stride, j : j + w_span : stride] += blocks[:, :, i, j]
    if pad:
        out = out[:, :, pad:-pad, pad:-pad]
    return out
