"""Adapters between the harness and the real machines of server/ (``NodeMachine``, ``ControllerMachine``).

Each adapter builds its machine as the production driver does, with the simulation's pieces
injected: ``random_bytes`` from the run's seeded rng (join tokens, routing ids), and
``params_outside=True``, so every apply leaves the machine as an ``Apply`` action that the adapter
carries out as a facade does (decoded into the replica, and the harness told which update was
applied) and every download as ``Install`` (the node's per-update counts start again). A node's own
update is applied locally first (as ``Node.submit(apply_locally=True)`` does), then the ``Submit``
event the driver delivers numbers and sends it (the machine returns ``ReleaseSlots`` and ``Notify``
for the facade too: the harness notes them).

``controller_available()`` says whether the controller machine exists on this branch yet: the
tests of the real machines skip (with that reason) until it does.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
from psrv.encoding import decode
from psrv.server.updates import check_payload
from psrv.transport.config import TransportConfig
from psrv.transport.events import Apply, Install, Submit

from sim.world import Hooks, Setup, SimConfig


def transport_config(cfg: SimConfig, name: str | None = None) -> TransportConfig:
    """The roles' configuration in a simulation: fast beats (ticks come every 10-50 ms)."""
    options = {
        "heartbeat_s": 0.1,
        "missed_beats": 3,
        "mesh": cfg.extra.get("mesh", "plain"),
        "fan_out": cfg.extra.get("fan_out", 8),
        "peer_queue_messages": cfg.bound,
        "node_name": name,
        "departed_kept_s": cfg.extra.get("departed_kept_s", 5.0),
        "max_nodes": cfg.extra.get("max_nodes", 1024),
        "max_pending_joins": cfg.extra.get("max_pending_joins", 64),
        "join_rate_per_s": cfg.extra.get("join_rate_per_s", 50.0),
        "replay_ring_messages": cfg.extra.get("replay_ring_messages", 4096),
        "linger_s": 0.0,
    }
    return TransportConfig(**options)


def carry_out(action: Any, params: np.ndarray, hooks: Hooks) -> None:
    """A facade's part for ``Apply`` (decode into the replica, tell the harness) and ``Install``."""
    if isinstance(action, Install):
        hooks.installed()
        return
    for payload, header in zip(action.payloads, action.headers, strict=True):
        decode(payload, params)  # checked whole at intake: a failure here is a bug the run reports
        hooks.applied(payload, header)


class NodeRole:
    def __init__(self, hooks: Hooks, address: str, controller: str, name: str, cfg: SimConfig) -> None:
        from psrv.server.node_machine import NodeMachine

        self.params = np.zeros(cfg.model_size, dtype=cfg.dtype)
        self.machine = NodeMachine(
            transport_config(cfg, name),
            self.params,
            controller,
            random_bytes=hooks.world.sched.rng.randbytes,
            params_outside=True,
        )
        self.hooks = hooks
        self.max_tau = self.machine.config.max_tau

    def replica(self) -> np.ndarray:
        return self.machine.params

    def carry_out(self, action: Any) -> None:
        carry_out(action, self.params, self.hooks)

    def rejected(self) -> dict[str, int]:
        return dict(self.machine.counters_.snapshot().get("rejected", {}))

    def member_id(self) -> int | None:
        node_id = self.machine.node_id
        return node_id if node_id > 0 else None

    def ready(self) -> bool:
        return str(self.machine.state) == "running" and self.machine.stopped is False

    def submit(self, payload: np.ndarray) -> list[Any] | None:
        if self.machine.stopped is not False:
            return None
        payload, info = check_payload(payload, self.params.size, "submitted update", self.max_tau)
        fields = {"iteration": 0, "epoch": 0, "tau": float(info.tau), "encoding": info.form}
        carry_out(Apply((payload,), ({},)), self.params, self.hooks)  # Node.submit(apply_locally=True)
        return [Submit(payload, fields, slot=False)]


class ControllerRole:
    def __init__(self, hooks: Hooks, address: str, cfg: SimConfig) -> None:
        module = importlib.import_module("psrv.server.controller_machine")
        self.params = np.zeros(cfg.model_size, dtype=cfg.dtype)
        self.machine = module.ControllerMachine(
            transport_config(cfg),
            self.params,
            session=hooks.world.sched.rng.randbytes(16),
            params_outside=True,
            address=address,
        )
        self.hooks = hooks

    def replica(self) -> np.ndarray:
        return self.machine.params

    def carry_out(self, action: Any) -> None:
        carry_out(action, self.params, self.hooks)

    def member_id(self) -> int | None:
        return 0

    def rejected(self) -> dict[str, int]:
        return dict(self.machine.counters.snapshot().get("rejected", {}))

    def ready(self) -> bool:
        return True

    def submit(self, payload: np.ndarray) -> None:
        return None


def controller_available() -> str | None:
    """None when the real machines can run here, else why not (the skip reason)."""
    try:
        importlib.import_module("psrv.server.controller_machine")
        importlib.import_module("psrv.server.node_machine")
    except ImportError as exc:
        return f"the real machines are not on this branch yet: {exc}"
    return None


def real_setup(hostile: bool = True) -> Setup:
    from sim.hostile import HostileRole

    return Setup(controller=ControllerRole, node=NodeRole, hostile=HostileRole if hostile else None)
