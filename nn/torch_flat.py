"""A torch module's parameters re-pointed into one flat buffer, its gradients into another, and the
optimizer's own step copy of them, so psrv's encoder and decoder work on one vector without copies.

The optimizer steps the *step buffer*, never the live parameters: a node's I/O thread may add
received updates into the live ones while a step runs, and none is lost.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from psrv.nn.errors import ConfigError
from psrv.nn.torch_device import import_torch

__all__ = ["FlatBuffers", "bind_flat_buffers", "computing_on_step_buffer", "computing_with",
           "load_step_buffer", "load_with", "point_at", "restore_grad_views", "steer_to_step_buffer",
           "step_before_after", "take_step"]


@dataclass
class FlatBuffers:
    """The trainable parameters (``params``: the module's own, now views into ``flat``), their flat
    gradient, a NumPy view of ``flat`` on the CPU (None elsewhere) and the optimizer's step copy."""

    params: list[Any]
    flat: Any
    flat_grad: Any
    grad_ptrs: list[int]
    host_view: np.ndarray | None
    step_flat: Any
    step_params: list[Any]
    base: Any = None  # the copy of the live parameters a step starts from, allocated on first use


def bind_flat_buffers(module: Any, dtype: Any, device: Any) -> FlatBuffers:
    """Move every trainable parameter of ``module`` into one flat buffer of ``dtype`` on ``device``
    (values kept) and every gradient into another, and build the step copy the optimizer owns."""
    torch = import_torch()
    params = [p for p in module.parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    flat = torch.zeros(total, dtype=dtype, device=device)
    flat_grad = torch.zeros(total, dtype=dtype, device=device)
    offset = 0
    grad_ptrs = []
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[offset : offset + n].copy_(p.detach().reshape(-1))
            p.data = flat[offset : offset + n].view_as(p)
            p.grad = flat_grad[offset : offset + n].view_as(p)
            grad_ptrs.append(p.grad.data_ptr())
            offset += n
    host_view = flat.numpy() if flat.device.type == "cpu" else None
    # the optimizer's own copy of the parameters: it steps these, never the live ones, and reads the
    # same gradient memory (each step parameter's .grad is the live parameter's gradient view)
    step_flat = flat.clone()
    step_params = []
    offset = 0
    for p in params:
        n = p.numel()
        shadow = torch.nn.Parameter(step_flat[offset : offset + n].view_as(p))
        shadow.grad = p.grad
        step_params.append(shadow)
        offset += n
    return FlatBuffers(params, flat, flat_grad, grad_ptrs, host_view, step_flat, step_params)


def steer_to_step_buffer(optimizer: Any, buffers: FlatBuffers) -> Any:
    """Point an optimizer built on the module's parameters at the step buffer instead (a factory
    that ignored its argument, or an Optimizer instance), carrying any state it already has."""
    to_step = {id(p): s for p, s in zip(buffers.params, buffers.step_params, strict=True)}
    owned = {id(s) for s in buffers.step_params}
    for group in optimizer.param_groups:
        steered = []
        for p in group["params"]:
            if id(p) in owned:
                steered.append(p)
            elif id(p) in to_step:
                shadow = to_step[id(p)]
                if p in optimizer.state:
                    optimizer.state[shadow] = optimizer.state.pop(p)
                steered.append(shadow)
            else:
                raise ConfigError(
                    "optimizer: expected it to hold only the module's trainable parameters, got a "
                    f"tensor of shape {tuple(p.shape)} that is not one of them; build it with a "
                    "factory, optimizer=lambda params: torch.optim.Adam(params, lr=1e-3)"
                )
        group["params"] = steered
    return optimizer


def restore_grad_views(buffers: FlatBuffers, keep_missing: bool = False, adopt: bool = False) -> None:
    """Point every parameter's ``.grad`` (and its step copy's) back at the flat gradient, copying a
    gradient torch allocated elsewhere (after ``zero_grad(set_to_none=True)``). ``keep_missing``: a
    parameter without a gradient keeps none (the optimizer then skips it, as torch does). ``adopt``:
    the step copy takes such a gradient where it is, with no copy (for a caller that never reads the
    flat gradient as one vector: it saves a pass over the parameters every step)."""
    offset = 0
    for p, shadow, ptr in zip(buffers.params, buffers.step_params, buffers.grad_ptrs, strict=True):
        n = p.numel()
        if p.grad is None and keep_missing:
            shadow.grad = None
            offset += n
            continue
        if adopt and p.grad is not None:
            if shadow.grad is not p.grad:
                shadow.grad = p.grad
            offset += n
            continue
        if p.grad is None or p.grad.data_ptr() != ptr:
            slot = buffers.flat_grad[offset : offset + n].view_as(p)
            if p.grad is None:
                slot.zero_()
            else:
                slot.copy_(p.grad)
            p.grad = slot
        if shadow.grad is not p.grad:
            shadow.grad = p.grad
        offset += n


def take_step(buffers: FlatBuffers, optimizer: Any, *args: Any, reuse: bool = False,
              **kwargs: Any) -> tuple[Any, Any]:
    """One ``optimizer.step()`` on the step buffer, loaded first with one read of the live parameters;
    returns (the step to ADD as a flat tensor, what ``step`` returned). The live parameters are never
    written: whatever a node's I/O thread decodes into them meanwhile stays (the step is then taken
    from a slightly older point, as in any asynchronous SGD). ``reuse``: no allocation per step (the
    returned step is the step buffer itself, valid until the next step); else the returned step is the
    one new tensor of the step, the caller's to keep."""
    torch = import_torch()
    after, before, returned = step_before_after(buffers, optimizer, *args, **kwargs)
    with torch.no_grad():
        # the snapshot is the buffers' own (no allocation); only the step returned is new when not reused
        return (after.sub_(before) if reuse else torch.sub(after, before)), returned


def load_step_buffer(buffers: FlatBuffers, load: Any = None) -> Any:
    """Fill the snapshot (returned) and the step buffer from the live parameters: ``load(live, snapshot,
    step_buffer)`` (default: two torch copies of the live parameters; a one-pass kernel on the CPU, or
    one that adds the worker's residual)."""
    torch = import_torch()
    with torch.no_grad():
        if buffers.base is None:
            buffers.base = torch.empty_like(buffers.flat)
        base = buffers.base
        if load is None:
            base.copy_(buffers.flat)
            buffers.step_flat.copy_(base)
        else:
            load(buffers.flat, base, buffers.step_flat)
    return base


def load_with(offset: Any) -> Any:
    """A ``load`` for ``load_step_buffer``: the live parameters plus ``offset`` (a tensor where they live,
    e.g. a worker's residual) into the snapshot and the step buffer, with torch ops on their device."""
    torch = import_torch()

    def load(live: Any, snapshot: Any, step_buffer: Any) -> None:
        with torch.no_grad():
            torch.add(live, offset, out=snapshot)
            step_buffer.copy_(snapshot)

    return load


def point_at(params: list[Any], data: list[Any]) -> None:
    """Re-point each parameter's data at the matching tensor (no copy; its gradient stays where it is)."""
    for p, d in zip(params, data, strict=True):
        p.data = d


@contextmanager
def computing_with(params: list[Any], data: list[Any]) -> Iterator[None]:
    """Inside, the parameters compute with ``data`` (``point_at``); after, with what they held before."""
    current = [p.data for p in params]
    try:
        point_at(params, data)
        yield
    finally:
        point_at(params, current)


def computing_on_step_buffer(buffers: FlatBuffers) -> Any:
    """Inside, the module computes with the step buffer instead of the live parameters (gradients still
    land in the flat gradient): a forward and backward pass at the point the step buffer was loaded
    with, while a node's I/O thread keeps writing the live ones."""
    return computing_with(buffers.params, [shadow.data for shadow in buffers.step_params])


def step_before_after(buffers: FlatBuffers, optimizer: Any, *args: Any, load: Any = None,
                      loaded: bool = False, **kwargs: Any) -> tuple[Any, Any, Any]:
    """``take_step(reuse=True)`` without the subtraction: returns (the step buffer after the step, the
    snapshot it started from, what ``step`` returned), both valid until the next step, so the caller can
    take the difference inside a pass of its own (the encoder's). The buffers are loaded first by
    ``load_step_buffer(buffers, load)``, unless ``loaded`` (the caller did so before its forward pass)."""
    if loaded:
        base = buffers.base
        if base is None:
            raise RuntimeError("step_before_after(loaded=True): load_step_buffer was not called first")
    else:
        base = load_step_buffer(buffers, load)
    returned = optimizer.step(*args, **kwargs)
    return buffers.step_flat, base, returned
