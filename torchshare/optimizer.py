"""``DistributedOptimizer``: any torch optimizer, made gradient-sharing (Horovod's shape, psrv's protocol).

The wrapped optimizer steps a *step buffer* (psrv.nn.torch_flat), never the live parameters (the
replica). The node's I/O thread decodes the other workers' updates into the live parameters whenever
they arrive; the user's optimizer never writes them, so none of those updates is lost or overwritten by
a step. By default (``step_from="own"``) the model computes with the step buffer, the replica plus what
this worker has not sent yet, so its steps start where its own earlier steps took it.

On the host the step buffer is persistent and the residual is implicit: it is the gap between the step
buffer and the live parameters (psrv.encoding.implicit_residual). Each ``step()`` is the wrapped
optimizer's step on the step buffer, then, under the node's lock, the node's writes to the live
parameters mirrored into the step buffer and one pass that threshold-encodes the gap and applies the
message to the live parameters; the message goes to the mesh. No load of the step buffer, no stored
residual. With nothing sent, the step buffer evolves bit for bit as the bare optimizer's parameters
(weight decay acts on it, i.e. on the live parameters plus the residual). On a device
(``device_encoding``) the step buffer is reloaded from the live parameters each step (with
``step_from="own"``: from the live parameters plus the residual, right after the step, so the model
computes with it) and the residual is a tensor of its own (psrv.torch.device_sharing).

Weights are loaded into the model *before* it is wrapped, or through this optimizer's
``load_state_dict`` after: a write to the model's parameters after wrapping moves the live parameters
but not the step buffer, so the next step would send the write back undone (the gap would hold it).

What users do around ``step()`` works unchanged: ``zero_grad()``, gradient accumulation (several
backward passes, then one step), ``clip_grad_norm_(model.parameters(), ...)``, ``torch.autocast`` with a
``GradScaler`` (it reads ``param_groups`` and calls ``step``), LR schedulers attached to the wrapped
optimizer or to this one. ``state_dict()`` holds the optimizer's state, the residual and the threshold
algorithm's state.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np
from psrv.encoding import (
    ResidualEncoder,
    compact,
    decode,
    dl4j_threshold,
    post_processor_from_state,
    threshold_algorithm_from_state,
)
from psrv.encoding.implicit_residual import ImplicitResidual
from psrv.nn.momentum import momentum_for_workers
from psrv.nn.torch_device import import_torch, place_module
from psrv.nn.torch_flat import (
    bind_flat_buffers,
    computing_with,
    load_step_buffer,
    load_with,
    point_at,
    restore_grad_views,
    steer_to_step_buffer,
    step_before_after,
)
from psrv.server import Node
from psrv.torch import session
from psrv.torch.device_sharing import DeviceSharing
from psrv.torch.errors import RendezvousError, SharingConfigError
from psrv.torch.rendezvous import JOIN_WAIT_S, ask

torch = import_torch()


class _LiveReplica:
    """The flat parameters as DeviceSharing sees a network: the device tensor, a host copy, a setter."""

    def __init__(self, flat: Any) -> None:
        self.flat_params = flat

    @property
    def params(self) -> np.ndarray:
        return self.flat_params.detach().cpu().numpy()

    def set_params(self, params: np.ndarray) -> None:
        with torch.no_grad():
            self.flat_params.copy_(torch.from_numpy(np.asarray(params)).to(self.flat_params.device))


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer`` (built on ``model.parameters()``) so that its steps are shared with every worker.

    ``threshold_algorithm`` / ``post_processor``: psrv.encoding's (default: DL4J's ``dl4j_threshold()``,
    i.e. ``AdaptiveThreshold(1e-3)``, and ``ResidualClipping(5, 5)``; ``SharedTrainingMaster`` and
    ``TorchEstimator`` default to ``psrv.encoding.shared_training_threshold()``, which costs this
    optimizer one more pass over the parameters per step).
    ``device_encoding``: encode and decode with torch ops where the parameters live (None: off the CPU,
    as a GPU worker must; True also on the CPU, the same messages byte for byte).
    ``join``: True joins the launcher's job now (``psrv.torch.init()`` is called if it was not); False
    trains alone (the encoded steps are applied locally only), e.g. to compare against one process.
    ``step_from``: "own" (the default, on the host) makes the model compute with the step buffer, i.e.
    the replica plus this worker's unsent residual, so each step starts where the worker's own steps
    took it (alone on the host, the model is then the bare optimizer's, bit for bit); the replica still
    holds only what was sent, and ``leave()`` puts the model back on it. With ``device_encoding`` the
    step buffer is loaded with replica + residual after each step. "shared" computes with the replica
    alone, as ``SharedTrainingMaster(step_from="shared")`` and DL4J do.
    ``scale_momentum``: True sets the wrapped optimizer's momentum to the given one
    ``** psrv.torch.size()`` when it joins, as ``SharedTrainingMaster`` does by default: Adam's beta1
    (every param group with ``betas``), and SGD's or RMSprop's momentum with its ``lr`` times
    (1 - momentum ** N) / (1 - momentum), which keeps the step's size (psrv.nn.momentum: with N
    workers sharing, beta ** N forgets per minibatch as one process does; README's "How much a step
    learns"); RMSprop's square average then starts at the first gradient's square, not at zero.
    Build an LR scheduler that sets ``lr`` from its initial values (LambdaLR, OneCycleLR)
    after wrapping, so that it starts from the scaled ``lr``. Off by default here: the loop is the
    user's, and the optimizer steps as they built it unless they ask.
    The model is re-pointed into one flat buffer (its tensors keep their identity, values and device);
    its parameters must be on one device, float32 or float64 (use ``torch.autocast`` for mixed precision).
    Load weights before wrapping (or with ``load_state_dict``): see the module docstring.
    """

    def __init__(self, optimizer: Any, model: Any, *, threshold_algorithm: Any = None,
                 post_processor: Any = None, device_encoding: bool | None = None, join: bool = True,
                 step_from: str = "own", scale_momentum: bool = False) -> None:
        if not isinstance(scale_momentum, bool):
            raise SharingConfigError(f"DistributedOptimizer: scale_momentum: expected True or False, got "
                                     f"{scale_momentum!r}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise SharingConfigError(
                f"DistributedOptimizer: expected a torch.optim.Optimizer built on model.parameters(), got "
                f"{type(optimizer).__name__}")
        if not isinstance(model, torch.nn.Module):
            raise SharingConfigError(f"DistributedOptimizer: expected the torch.nn.Module being trained, "
                                     f"got {type(model).__name__}")
        trainable = {id(p) for p in model.parameters() if p.requires_grad}
        strangers = [tuple(p.shape) for g in optimizer.param_groups for p in g["params"]
                     if id(p) not in trainable]
        if strangers:
            raise SharingConfigError(
                f"DistributedOptimizer: the optimizer holds tensors that are not the model's trainable "
                f"parameters (shapes {strangers[:3]}); build it on model.parameters() (or param groups of "
                "them) of the model you pass")
        self.device, dtype = place_module(model, None)
        self.model = model
        self._buffers = bind_flat_buffers(model, dtype, self.device)
        self.optimizer = steer_to_step_buffer(optimizer, self._buffers)
        self.defaults = optimizer.defaults
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                      "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                      "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks"):
            setattr(self, hooks, OrderedDict())
        on_device = self.device.type != "cpu" if device_encoding is None else bool(device_encoding)
        self.encoder = ResidualEncoder(
            self.num_params, dtype=np.dtype(str(dtype).removeprefix("torch.")),
            threshold_algorithm=threshold_algorithm if threshold_algorithm is not None else dl4j_threshold(),
            post_processor=post_processor,  # None: ResidualEncoder's ResidualClipping(), DL4J's (5, 5)
            device=self.device if on_device else None)
        self.sharing = DeviceSharing(_LiveReplica(self._buffers.flat), self.encoder) if on_device else None
        self.implicit = None if on_device else ImplicitResidual(
            self.encoder, self._buffers.host_view, self._buffers.step_flat.numpy())
        if step_from not in ("own", "shared"):
            raise SharingConfigError(
                f"DistributedOptimizer: step_from: expected 'own' (steps from the replica plus this "
                f"worker's residual) or 'shared' (from the replica alone), got {step_from!r}")
        self.step_from = step_from
        self.scale_momentum = scale_momentum
        self.momentum: list[tuple[str, float, float]] = []  # what scale_momentum set: (name, given, used)
        self._live_data = [p.data for p in self._buffers.params]  # the model's views of the replica
        if self.step_from == "own":  # the model computes with the step buffer (live + residual)
            point_at(self._buffers.params, [shadow.data for shadow in self._buffers.step_params])
        self.node: Node | None = None
        self.lock: Any = threading.RLock()  # the node's lock once joined: every write of the live params
        self.iterations = self.messages = self.bytes_sent = 0
        if join:
            if self.implicit is not None:
                self.implicit.warm_up()  # no numba compile inside a member's step or I/O thread
            self._join()
        self._load_own_point()

    # --- what torch.optim.Optimizer users and tools read ------------------------------------------

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The wrapped optimizer's groups (their params are the step copies; each one's ``.grad`` is the
        model parameter's gradient, re-pointed first, so GradScaler and schedulers see the real ones)."""
        restore_grad_views(self._buffers, keep_missing=True, adopt=True)
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def num_params(self) -> int:
        return int(self._buffers.flat.numel())

    @property
    def flat_params(self) -> Any:
        """The live flat parameter tensor, the replica (the decoder writes it; the model computes with
        views of it with ``step_from="shared"``, of the step buffer with "own")."""
        return self._buffers.flat

    def on_replica(self) -> Any:
        """A context inside which the model computes with the replica (the live parameters, what every
        worker holds once the updates in flight arrived) instead of the step buffer: how to evaluate the
        shared model in the middle of training with ``step_from="own"`` (with "shared" it does anyway)."""
        return computing_with(self._buffers.params, self._live_data)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise SharingConfigError("DistributedOptimizer: param groups are fixed once wrapped; give the "
                                 "wrapped optimizer all its groups before wrapping it")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's: the model's gradients become None (or zeros)."""
        for p in self._buffers.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        for shadow in self._buffers.step_params:
            shadow.grad = None if set_to_none else shadow.grad

    # --- the step ----------------------------------------------------------------------------------

    def step(self, closure: Any = None) -> Any:
        """The wrapped optimizer's step, shared: encoded, applied locally, submitted (see the module)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        restore_grad_views(self._buffers, keep_missing=True, adopt=True)
        if self.implicit is None:  # the step buffer is loaded at every step (with "own": after it)
            own = self.step_from == "own"
            after, before, _ = step_before_after(self._buffers, self.optimizer, loaded=own)
            self.iterations += 1
            with torch.no_grad():
                message = self.encoder.encode_update(after.sub_(before))
            if message is not None:
                self._submit_from_device(message)
            self._load_own_point()
            return loss
        with self.lock:
            self.implicit.begin_step()  # the node's writes wait for the mirror while B is stepped
        try:
            self.optimizer.step()  # on the persistent step buffer: the step joins the implicit residual
        except BaseException:
            with self.lock:
                self.implicit.end_step()
            raise
        self.iterations += 1
        with self.lock:  # the node's writes mirrored, the gap encoded and applied, the message submitted
            message = self.implicit.encode_step()
            if message is not None:
                self._submit_from_host(message)
        return loss

    def _load_own_point(self) -> None:
        """The device path with ``step_from="own"``: the step buffer (what the model computes with) and
        its snapshot become the replica plus the residual, read under the lock. The updates decoded
        into the replica after this load reach the step buffer at the next one (one step later)."""
        if self.implicit is None and self.step_from == "own":
            with self.lock:
                load_step_buffer(self._buffers, load_with(self.encoder.residual))

    def _submit_from_host(self, message: np.ndarray) -> None:
        """Hand an own message (already applied to the live parameters) to the node, under its lock. If
        the node refuses it (e.g. its send queue stayed full), the apply is taken back: the update
        returns to the residual (the gap) and goes with a later step."""
        message = compact(message)  # the form it travels in, so the bytes counted are the wire's
        if self.node is not None:
            try:
                self.node.submit(message, iteration=self.iterations, epoch=0, apply_locally=False)
            except Exception:
                decode(message, self._buffers.host_view, scale=-1.0)
                raise
        self.messages += 1
        self.bytes_sent += int(message.nbytes)

    def _submit_from_device(self, message: Any) -> None:
        if self.node is None:
            from psrv.encoding import device as codec  # lazy: the device codec imports torch ops

            with self.lock:
                codec.decode(message, self._buffers.flat)
            sent = int(message.numel()) * 4
        else:
            sent = self.sharing.submit(self.node, message, self.iterations, 0)
        self.messages += 1
        self.bytes_sent += sent

    # --- state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The wrapped optimizer's state dict, the residual (a host copy) and the threshold state."""
        if self.implicit is not None:
            with self.lock:
                residual = self.implicit.residual()
        else:
            residual = self.encoder.residual.detach().cpu().numpy().copy()
        return {"optimizer": self.optimizer.state_dict(),
                "residual": residual,
                "threshold": self.encoder.threshold_algorithm.get_state(),
                "post_processor": self.encoder.post_processor.get_state(),
                "iterations": self.iterations}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Restore what ``state_dict`` returned (a plain optimizer's state dict is accepted too). The
        residual is restored on top of the live parameters as they are now (the step buffer becomes
        them plus the residual), so load the model's weights first, before wrapping."""
        if "optimizer" not in state_dict:  # the state of the optimizer before it was wrapped
            self.optimizer.load_state_dict(state_dict)
            return
        self.optimizer.load_state_dict(state_dict["optimizer"])
        residual = np.asarray(state_dict["residual"])
        if residual.shape != (self.num_params,):
            raise SharingConfigError(f"load_state_dict: the residual has shape {residual.shape}, this "
                                     f"model has {self.num_params} parameters")
        if self.implicit is not None:
            with self.lock:
                self.implicit.set_residual(residual)
        else:
            self.sharing.set_residual(residual)
            self._load_own_point()
        self.encoder.threshold_algorithm = threshold_algorithm_from_state(state_dict["threshold"])
        self.encoder.post_processor = post_processor_from_state(state_dict["post_processor"])
        self.iterations = int(state_dict.get("iterations", 0))

    # --- joining and leaving -------------------------------------------------------------------------

    def _join(self) -> None:
        """Join the launcher's job: rank 0's parameters start the master copy; every rank downloads it."""
        here = session.attach(self)
        env = here.env
        if self.scale_momentum:
            self.momentum = [(c.name, c.given, c.now) for c in momentum_for_workers(self.optimizer, env.size)]
        host = self.sharing.network.params if self.implicit is None else self._buffers.host_view
        reply = ask(env, ("join", env.rank, host if env.rank == 0 else None), JOIN_WAIT_S + 30.0)
        if reply[0] != "controller":
            raise RendezvousError(f"rank {env.rank}: the launcher aborted the job: {reply[1]}")
        _, address, transport = reply
        config = transport.replace(node_name=f"{env.job}-r{env.rank}")
        sharing: Any = self.sharing if self.implicit is None else self.implicit
        node = Node(config, sharing.node_params, address, **sharing.node_hooks())
        node.start()  # joins and downloads the master copy into the live parameters
        self.node, self.lock = node, node.lock

    def leave(self) -> dict[str, Any]:
        """Wait until the controller holds every update sent, check the replica, stop the node; returns
        this worker's report (counts, the replica check, the node's counters). The model computes with
        the replica from here on (with ``step_from="own"`` it held the unsent residual too)."""
        node = self.node
        report: dict[str, Any] = {"steps": self.iterations, "messages": self.messages,
                                  "bytes_sent": self.bytes_sent, "step_from": self.step_from,
                                  "momentum": self.momentum}
        point_at(self._buffers.params, self._live_data)
        if node is None:
            return report
        config = node.config
        wait_s = config.heartbeat_s * (config.missed_beats + 4)
        try:
            current = ((lambda: self.sharing.network.params) if self.implicit is None
                       else (lambda: self._buffers.host_view))
            report["replica"] = node.check_replica(wait_s + 5.0, current=current).as_dict()
            report["acknowledged"] = node.wait_acknowledged(wait_s)
            report["counters"] = node.counters()
            report["node_id"] = node.node_id
            report["node_ids"] = list(node.ids_held)  # a rejoin (e.g. after a stall) gets a new id
        finally:
            node.stop()
            self.node = None
        return report


__all__ = ["DistributedOptimizer"]
