"""What every part of the node machine reads: who this node is, what it sees, and where its actions go.

The node's parts (server/node_updates.py, node_sync.py, node_timers.py, node_repairs.py) each own
their own state; what more than one of them needs lives here, in one object they are all given:
the configuration (the controller may change its pace at a join), the live parameters, the
identity (address, session, member id, state), the mesh view and the connections held to it, the
origins the controller still counts, its watermark of our updates, and the list of actions of the
event being handled (``emit``).
"""

from __future__ import annotations

import logging

import numpy as np
from psrv.server.identity import link_id
from psrv.server.mesh import CONTROLLER_ID, MeshOrganizer
from psrv.server.node_guard import Routes
from psrv.server.node_state import NodeState
from psrv.transport.config import TransportConfig
from psrv.transport.counters import Counters, RateLimitedLog
from psrv.transport.events import Action, Notify, Send
from psrv.transport.messages import UNJOINED, Message

__all__ = ["NodeView"]


class NodeView:
    """The node's shared state and its outbox; see the module docstring."""

    def __init__(
        self, config: TransportConfig, params: np.ndarray, controller_address: str, counters: Counters
    ) -> None:
        self.config = config
        self.params = params
        self.controller_address = controller_address
        self.counters = counters
        self.log = logging.getLogger("psrv.transport.node")
        self.now = 0.0
        self.limited = RateLimitedLog(self.log, config.log_interval_s, clock=lambda: self.now)
        self.address: str | None = None
        self.session = b""  # drawn per join: the key of this node's per-link routing ids (``link_id``)
        self.node_id = UNJOINED
        self.state = NodeState.JOINING
        self.mesh: MeshOrganizer | None = None
        self.peers: dict[int, str] = {}  # mesh neighbours we hold a connection to -> their address
        self.routes = Routes()
        self.recent_origins: set[int] = set()  # departed members whose updates may still arrive
        self.ctrl_origins: set[int] = set()  # the origins of the controller's last watermark
        self.departed_at: dict[int, float] = {}  # left our mesh view -> when
        self.acknowledged = 0  # the controller's watermark of our own updates, as last announced
        self.out: list[Action] = []

    def link_id(self, to: int) -> bytes:
        """The routing id this node's connection to member ``to`` presents (server/identity.py)."""
        return link_id(self.session, to)

    def emit(self, action: Action) -> None:
        self.out.append(action)

    def send_ctrl(self, message: Message, *, urgent: bool = False) -> None:
        self.emit(Send(CONTROLLER_ID, message, urgent=urgent))

    def reject(self, reason: str, detail: str) -> None:
        self.counters.reject(reason)
        self.limited.warning(f"reject:{reason}", "node %s rejected a message (%s): %s",
                             self.address, reason, detail)

    def set_acknowledged(self, watermark: int) -> None:
        if watermark != self.acknowledged:
            self.acknowledged = watermark
            self.emit(Notify("acknowledged"))

    def allowed_departed(self) -> set[int]:
        """Departed origins whose updates a neighbour may still hand us."""
        return self.recent_origins | self.ctrl_origins
