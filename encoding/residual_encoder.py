"""ResidualEncoder: what a worker runs every step (residual += update; encode; post-process; adapt tau)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from psrv.encoding.codec import (
    add_difference,
    add_difference_encode_counted,
    encode_counted,
    encode_gap_counted,
)
from psrv.encoding.postprocess import NoResidualPostProcessor, ResidualClipping, ResidualPostProcessor
from psrv.encoding.stats import EncodingStats, encoding_stats
from psrv.encoding.thresholds import AdaptiveThreshold, ThresholdAlgorithm

log = logging.getLogger(__name__)


class ResidualEncoder:
    """Holds one worker's residual and turns each update into a threshold-encoded message.

    Defaults follow DL4J's shared training: AdaptiveThreshold() and ResidualClipping(5, 5).
    ``threshold_algorithm=SampledQuantileThreshold()`` takes tau from the residual's own magnitudes
    every step instead (about 0.9 % of the elements sent, no dense first messages).
    Pass ``post_processor=NoResidualPostProcessor()`` to disable clipping. With ``debug=True`` each
    step also computes ``last_stats`` (an EncodingStats of the residual before encoding).

    With ``device`` (a torch device such as "cuda:0" or "cpu") the residual is a torch tensor there,
    updates are torch tensors and messages are int32 tensors on that device (psrv.encoding.device, the
    same wire format); the threshold algorithm and clipping behave the same and only the hit count
    crosses to the host each step (the debug statistics copy the residual to the host).
    """

    def __init__(self, size: int, *, dtype=np.float32, threshold_algorithm: ThresholdAlgorithm | None = None,
                 post_processor: ResidualPostProcessor | None = None, debug: bool = False,
                 threads: int = 1, device: Any = None) -> None:
        if not isinstance(size, int | np.integer) or size < 0:
            raise ValueError(f"size must be a non-negative int, got {size!r}")
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"dtype must be float32 or float64, got {dtype}")
        self.device = device
        if device is None:
            self.residual: Any = np.zeros(int(size), dtype=dtype)
        else:
            import torch

            torch_dtype = torch.float32 if dtype == np.dtype(np.float32) else torch.float64
            self.residual = torch.zeros(int(size), dtype=torch_dtype, device=device)
        self.threshold_algorithm = (threshold_algorithm if threshold_algorithm is not None
                                    else AdaptiveThreshold())
        self.post_processor = post_processor if post_processor is not None else ResidualClipping()
        self.debug = debug
        self.threads = threads
        self.steps = 0
        self.last_stats: EncodingStats | None = None
        self.last_count = 0

    @property
    def size(self) -> int:
        return int(self.residual.shape[0])

    def encode_update(self, update: Any) -> Any:
        """residual += update; encode with the current tau; post-process; let the algorithm observe.

        Returns the message (None when nothing reached tau). The caller applies the message to its own
        parameters (decode) and hands it on. If the residual turns non-finite, NonFiniteResidualError
        propagates and the residual keeps the update added (nothing was emitted for this step).
        """
        if self.device is not None:
            return self._encode_on_device(update)
        update = np.asarray(update)
        if update.shape != self.residual.shape:
            raise ValueError(
                f"update has shape {update.shape}; this encoder's residual is {self.residual.shape}")
        if update.dtype.kind != "f":
            raise TypeError(f"update must be a float array, got dtype {update.dtype}")
        np.add(self.residual, update, out=self.residual, casting="same_kind")
        tau = self._threshold()
        if self.debug:
            self.last_stats = encoding_stats(self.residual, tau)
        message, count = encode_counted(self.residual, tau, threads=self.threads)
        return self._after_encode(message, count, tau)

    def encode_difference(self, after: Any, before: Any) -> Any:
        """``encode_update(after - before)`` without the difference ever being written: an optimizer's
        step given as its parameters after and before it. On the host, with both arrays of the
        residual's dtype, the sum, the threshold scan and the encoding are one pass over the vectors
        (two when the threshold algorithm or debug statistics must see the summed residual first); the
        message, residual and threshold state are bit for bit those of ``encode_update``."""
        if self.device is not None or not _same_vectors(self.residual, after, before):
            return self.encode_update(np.subtract(after, before) if self.device is None else after - before)
        tau = self._sampled_threshold(lambda s: self.residual[::s] + np.subtract(after[::s], before[::s]))
        if tau is not None:  # from the sum at the sampled elements only: still one pass
            message, count = add_difference_encode_counted(self.residual, after, before, tau,
                                                           threads=self.threads)
        elif self.debug or getattr(self.threshold_algorithm, "prepare", None) is not None:
            add_difference(self.residual, after, before)
            tau = self._threshold()
            if self.debug:
                self.last_stats = encoding_stats(self.residual, tau)
            message, count = encode_counted(self.residual, tau, threads=self.threads)
        else:
            tau = self.threshold_algorithm.threshold
            message, count = add_difference_encode_counted(self.residual, after, before, tau,
                                                           threads=self.threads)
        return self._after_encode(message, count, tau)

    def encode_gap(self, step: np.ndarray, live: np.ndarray) -> np.ndarray | None:
        """Encode the implicit residual ``step - live`` (psrv.encoding.implicit_residual: a persistent
        step buffer and the live parameters) and add the message to ``live`` in the same pass;
        post-process the gap by moving ``step``; let the algorithm observe. Threshold state, ``steps``
        and ``last_count`` advance as in ``encode_update``. On the host only; ``self.residual`` is then
        scratch, holding the gap only while a threshold algorithm with ``prepare`` (and no
        ``prepare_sample``), the debug statistics or a post-processor of the user's own must see it.
        ResidualClipping clips the gap inside the encoding pass on its steps
        (``encode_gap_counted(clip=)``)."""
        if self.device is not None:
            raise ValueError("encode_gap works on host vectors; a device encoder takes encode_update")
        tau = self._sampled_threshold(lambda s: np.subtract(step[::s], live[::s]))  # the gap, sampled
        if tau is None and (self.debug or getattr(self.threshold_algorithm, "prepare", None) is not None):
            np.subtract(step, live, out=self.residual)
            tau = self._threshold()
            if self.debug:
                self.last_stats = encoding_stats(self.residual, tau)
        elif tau is None:
            tau = self.threshold_algorithm.threshold
        processor = self.post_processor
        clipping = type(processor) is ResidualClipping  # clipped inside the encoding pass when due
        message, count = encode_gap_counted(step, live, tau, threads=self.threads,
                                            clip=processor.upcoming_limit(tau) if clipping else None)
        if clipping:
            processor.due_limit(tau)  # counts the step
        elif type(processor) is not NoResidualPostProcessor:
            self._post_process_gap(step, live, tau)
        return self._observed(message, count)

    def _post_process_gap(self, step: np.ndarray, live: np.ndarray, tau: float) -> None:
        """A post-processor of the user's own sees the gap materialized; ``step`` takes what it changed."""
        processor = self.post_processor
        gap = self.residual
        np.subtract(step, live, out=gap)
        before = gap.copy()
        processor.process(gap, tau)
        changed = gap.view(_BITS[gap.dtype]) != before.view(_BITS[gap.dtype])
        np.add(live, gap, out=step, where=changed)

    def _encode_on_device(self, update: Any) -> Any:
        import torch
        from psrv.encoding import device  # lazy: device.py needs torch, an optional dependency

        if not isinstance(update, torch.Tensor):
            update = torch.as_tensor(np.asarray(update))
        if tuple(update.shape) != tuple(self.residual.shape):
            raise ValueError(f"update has shape {tuple(update.shape)}; this encoder's residual is "
                             f"{tuple(self.residual.shape)}")
        if not update.is_floating_point():
            raise TypeError(f"update must be a float tensor, got dtype {update.dtype}")
        update = update.to(self.residual.device)
        if update.dtype == self.residual.dtype:
            self.residual.add_(update)
        else:  # as numpy's same_kind add: computed in the wider type, rounded once into the residual
            self.residual.copy_(self.residual + update)
        tau = self._threshold()
        if self.debug:
            self.last_stats = encoding_stats(self.residual.cpu().numpy(), tau)
        message, count = device.encode_counted(self.residual, tau)
        return self._after_encode(message, count, tau)

    def _sampled_threshold(self, sample: Any) -> float | None:
        """tau for this step from the residual's sampled elements alone, computed by ``sample(stride)``,
        where the threshold algorithm takes a strided sample (``sample_stride`` and ``prepare_sample``)
        and no debug statistics need the whole residual; None otherwise."""
        sampling = None if self.debug else _sampling(self.threshold_algorithm, self.size)
        if sampling is None:
            return None
        stride, prepare_sample = sampling
        prepare_sample(sample(stride))
        return self.threshold_algorithm.threshold

    def _threshold(self) -> float:
        """tau for this step; an algorithm with ``prepare(residual)`` sees the residual first."""
        prepare = getattr(self.threshold_algorithm, "prepare", None)
        if prepare is not None:
            prepare(self.residual)
        return self.threshold_algorithm.threshold

    def _after_encode(self, message: Any, count: int, tau: float) -> Any:
        self.post_processor.process(self.residual, tau)
        return self._observed(message, count)

    def _observed(self, message: Any, count: int) -> Any:
        self.threshold_algorithm.observe(count, self.size)
        self.steps += 1
        self.last_count = count
        if self.debug:
            log.debug("encode step %d: %s -> %d elements", self.steps, self.last_stats, count)
        return message

    def reset(self) -> None:
        """Forget the residual (e.g. after the parameters were replaced by a downloaded copy)."""
        self.residual[:] = 0
        self.last_stats = None


_BITS = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def _sampling(algorithm: Any, n: int) -> tuple[int, Any] | None:
    """(stride, prepare_sample) of a threshold algorithm whose ``prepare(residual)`` is
    ``prepare_sample(residual[::sample_stride(n)])``, for a residual of ``n`` elements; None for any
    other (it gets ``prepare`` with the whole residual written out, or nothing)."""
    prepare_sample = getattr(algorithm, "prepare_sample", None)
    sample_stride = getattr(algorithm, "sample_stride", None)
    if prepare_sample is None or sample_stride is None:
        return None
    stride = sample_stride(n)
    if isinstance(stride, bool) or not isinstance(stride, int | np.integer) or stride < 1:
        raise ValueError(f"{type(algorithm).__name__}.sample_stride({n}) must be an int >= 1, got {stride!r}")
    return int(stride), prepare_sample


def _same_vectors(residual: np.ndarray, *arrays: Any) -> bool:
    """Whether every array can go to the fused kernels with ``residual`` (same dtype and length,
    contiguous, writeable NumPy arrays)."""
    return all(isinstance(a, np.ndarray) and a.dtype == residual.dtype and a.shape == residual.shape
               and a.flags.c_contiguous and a.flags.aligned and a.flags.writeable for a in arrays)


__all__ = ["NoResidualPostProcessor", "ResidualEncoder"]
