"""im2col / col2im for NCHW images: convolution becomes one BLAS matrix product per pass.

The column matrix is laid out channel-major, (C*kh*kw, N*OH*OW): each kernel offset (i, j) fills one
contiguous block with a strided copy of the image, and col2im adds each block back. The only Python
loops run over kernel offsets (kh * kw iterations), never over pixels or examples.
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
    """(C*kh*kw, N*OH*OW) matrix: row (c, i, j) holds input pixel (c, oh*s+i, ow*s+j) of every window."""
    n, c, h, w = x.shape
    oh, ow = output_size(h, kh, stride, pad), output_size(w, kw, stride, pad)
    xc = x.transpose(1, 0, 2, 3)  # (C, N, H, W) view
    if pad:
        padded = np.zeros((c, n, h + 2 * pad, w + 2 * pad), dtype=x.dtype)
        padded[:, :, pad : pad + h, pad : pad + w] = xc
        xc = padded
    cols = np.empty((c, kh, kw, n, oh, ow), dtype=x.dtype)
    h_span, w_span = stride * (oh - 1) + 1, stride * (ow - 1) + 1
    for i in range(kh):
        for j in range(kw):
            cols[:, i, j] = xc[:, :, i : i + h_span : stride, j : j + w_span : stride]
    return cols.reshape(c * kh * kw, n * oh * ow)


def col2im(
    cols: np.ndarray, x_shape: tuple[int, ...], kh: int, kw: int, stride: int, pad: int
) -> np.ndarray:
    """Adjoint of im2col: sums every (C*kh*kw, N*OH*OW) column back into an (N, C, H, W) image."""
    n, c, h, w = x_shape
    oh, ow = output_size(h, kh, stride, pad), output_size(w, kw, stride, pad)
    blocks = cols.reshape(c, kh, kw, n, oh, ow)
    out = np.zeros((c, n, h + 2 * pad, w + 2 * pad), dtype=cols.dtype)
    h_span, w_span = stride * (oh - 1) + 1, stride * (ow - 1) + 1
    for i in range(kh):
        for j in range(kw):
            out[:, :, i : i + h_span : stride, j : j + w_span : stride] += blocks[:, i, j]
    if pad:
        out = out[:, :, pad : pad + h, pad : pad + w]
    return out.transpose(1, 0, 2, 3)  # (N, C, H, W) view


__all__ = [
    "col2im",
    "im2col",
    "output_size",
    "windows",
]
