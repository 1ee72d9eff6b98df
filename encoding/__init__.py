"""psrv.encoding: threshold encoding of sparse updates (numba kernels), threshold algorithms, residual post-processing."""
