"""An implicit residual: a persistent step buffer whose gap to the live parameters IS the residual.

A worker's optimizer steps a step buffer ``B``, never the live parameters ``L`` the model computes with
and a node's I/O thread decodes received updates into. The usual design reloads ``B`` from ``L`` before
every step and keeps the residual as a vector of its own: two extra passes over the parameters per
step. Here ``B`` is never reloaded and the invariant ``B - L == residual`` holds at every sync point, so
the residual is never stored:

* the optimizer steps ``B`` in place (the step joins the residual by itself);
* every write the node makes to ``L`` is mirrored into ``B``: at once while no optimizer step runs,
  else later, by the training thread (``begin_step`` ... ``encode_step``): the node's
  ``apply``/``apply_many`` hooks decode into ``L`` and queue the payload; ``installed(params)`` (a
  download: catch-up, re-sync) sets ``L = params`` and queues the pair (old ``L``, new ``L``), which
  the mirror turns into ``B = new + (B - old)``: the residual survives the install. After a download
  the node re-applies the own updates the master copy lacks (the backlog, given-up updates) through
  the same ``apply`` hook: the install moved ``B`` with ``L`` off those updates, so mirroring their
  re-application puts them back in ``B`` too, and the residual is unchanged again;
* the worker's own message is applied to ``L`` by the encoding pass itself and is never mirrored
  (``ResidualEncoder.encode_gap``: the gap ``B - L`` is scanned, sent, and what is sent moves ``L``
  toward ``B``; the residual left is the gap that remains). It goes to the node with
  ``submit(message, apply_locally=False)`` under the same lock.

With nothing sent, ``B`` evolves exactly as the bare optimizer's own parameters would, bit for bit; the
residual keeps the step buffer's precision (a step below the parameters' float resolution is lost, as
it is for the bare optimizer). Every method runs under the lock that guards ``L`` (the node's lock once
joined): the hooks are called under it by the node, the training thread takes it for ``encode_step``,
``residual`` and ``set_residual``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psrv.encoding.codec import encode, encode_gap_counted
from psrv.encoding.messages import decode_validated, message_info
from psrv.encoding.residual_encoder import ResidualEncoder


class ImplicitResidual:
    """The residual as the gap between a step buffer and the live parameters (see the module docstring).

    ``live`` and ``step`` are host vectors of one float dtype and length (``step`` starts equal to
    ``live``, or ``live`` plus a carried residual); ``encoder`` holds the threshold algorithm and the
    post-processor (its own residual vector is only scratch). ``node_params`` and ``node_hooks()`` go
    to the Node.
    """

    def __init__(self, encoder: ResidualEncoder, live: np.ndarray, step: np.ndarray) -> None:
        if encoder.device is not None:
            raise ValueError("ImplicitResidual is the host path; a device encoder uses DeviceSharing")
        for name, array in (("live", live), ("step", step)):
            if not isinstance(array, np.ndarray) or array.shape != (encoder.size,) or \
                    array.dtype != encoder.residual.dtype:
                raise ValueError(f"{name} must be a {encoder.residual.dtype} vector of {encoder.size} "
                                 f"elements (the encoder's), got {getattr(array, 'dtype', type(array))}"
                                 f"{list(getattr(array, 'shape', []))}")
        self.encoder, self.live, self.step = encoder, live, step
        self.node_params = live.copy()  # the node's download target; L is written through the hooks
        self._pending: list[Any] = []  # payloads, and (old, new) pairs of an install, to mirror into B
        self._stepping = False  # the optimizer may be writing B: the node's writes wait in _pending

    def warm_up(self) -> None:
        """Compile (or load from numba's cache) the kernels of the hooks and of the gap pass, before the
        node joins: numba compiles while holding the GIL, and a first compile inside a member's step or
        I/O thread starves its heartbeats on a loaded machine (it is then evicted and must rejoin).
        Every wire form once, on small vectors of this dtype; nothing of this worker's state is touched."""
        dtype = self.live.dtype
        for size, hits in ((32, 32), (4096, 1)):  # every element at tau: the bitmap; one: sparse
            step, live = np.zeros(size, dtype=dtype), np.zeros(size, dtype=dtype)
            step[:hits] = 1.0
            message, _ = encode_gap_counted(step, live, 0.5, clip=2.0)
            message_info(message)  # the node's intake validates each received update with these
            decode_validated(message, step)
            decode_validated(encode(np.ones(size, dtype=dtype), 0.5), live)

    # --- the node's hooks (called under its lock) -----------------------------------------------------

    def node_hooks(self) -> dict[str, Any]:
        return {"apply": self.apply, "apply_many": self.apply_many, "installed": self.installed}

    def apply(self, payload: np.ndarray, header: dict) -> None:
        """A received (or re-applied own) update: into ``L`` now, into ``B`` at the next mirror."""
        decode_validated(payload, self.live)
        self._queued(payload)

    def apply_many(self, payloads: list[np.ndarray], headers: list[dict]) -> list[Exception | None]:
        """An UPDATES frame's updates, each as ``apply``; a failing one is returned as its error."""
        errors: list[Exception | None] = []
        for payload, header in zip(payloads, headers, strict=True):
            try:
                self.apply(payload, header)
                errors.append(None)
            except Exception as exc:  # the intake checked it; a failure here is reported, not raised
                errors.append(exc)
        return errors

    def installed(self, params: np.ndarray) -> None:
        """The node downloaded the master copy: ``L = params``; ``B`` follows it at the next mirror,
        keeping its gap (the residual)."""
        old = self.live.copy()
        np.copyto(self.live, params, casting="same_kind")
        self._queued((old, self.live.copy()))

    def _queued(self, entry: Any) -> None:
        self._pending.append(entry)
        if not self._stepping:  # nobody writes B now: mirror at once, so the queue stays short
            self.mirror()

    # --- the training thread (under the same lock) ----------------------------------------------------

    def mirror(self) -> None:
        """Bring ``B`` up to every write the node made to ``L`` since the last mirror."""
        pending, self._pending = self._pending, []
        for entry in pending:
            if isinstance(entry, tuple):
                old, new = entry
                np.subtract(self.step, old, out=self.step)
                np.add(self.step, new, out=self.step)
            else:
                decode_validated(entry, self.step)

    def begin_step(self) -> None:
        """The optimizer is about to step ``B`` (outside the lock): the node's writes wait until
        ``end_step`` or ``encode_step``."""
        self._stepping = True

    def end_step(self) -> None:
        """The optimizer's step is over (or failed): mirror what waited."""
        self._stepping = False
        self.mirror()

    def encode_step(self) -> np.ndarray | None:
        """After the optimizer stepped ``B``: ``end_step``, then encode the gap, applying the message to
        ``L`` in the same pass. Returns the message (None when nothing reached tau) for the caller to
        submit without applying it again (``apply_locally=False``), still under the lock."""
        self.end_step()
        return self.encoder.encode_gap(self.step, self.live)

    def residual(self) -> np.ndarray:
        """The residual now, ``B - L`` (a new array)."""
        self.mirror()
        return np.subtract(self.step, self.live)

    def set_residual(self, residual: np.ndarray) -> None:
        """Carry a residual over (a saved state): ``B = L + residual``."""
        residual = np.asarray(residual)
        if residual.shape != self.live.shape:
            raise ValueError(f"the residual has shape {residual.shape}; these parameters have "
                             f"{self.live.shape}")
        self._pending.clear()  # B is rebuilt from L, which already holds every write
        np.add(self.live, residual, out=self.step, casting="same_kind")


__all__ = ["ImplicitResidual"]
