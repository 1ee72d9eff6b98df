"""A gradient-sharing task's node: joining the driver's controller, and leaving without losing updates."""

from __future__ import annotations

import logging
import os
import socket

from psrv.nn.protocol import TrainableNetwork
from psrv.server.node import Node
from psrv.spark.config import split_address
from psrv.spark.errors import ControllerUnreachableError
from psrv.spark.task.setup import WorkerSetup
from psrv.spark.task.worker import worker_id
from psrv.torch.device_sharing import DeviceSharing
from psrv.transport import TransportError

log = logging.getLogger(__name__)


def route_source_address(address: str) -> str | None:
    """The local IP this host would use to reach ``address`` ("host:port"), or None.

    A UDP socket's connect() sends nothing; it only asks the routing table which interface
    leads there — the address the controller can reach this node back at.
    """
    try:
        host, port = split_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port or 9))
            return str(probe.getsockname()[0])
    except (OSError, ValueError):
        return None


def start_node(setup: WorkerSetup, network: TrainableNetwork, part: int,
               sharing: DeviceSharing | None = None) -> Node:
    """A started node of this task, joined to the controller (it downloaded the master copy)."""
    config = setup.transport.replace(node_name=f"{setup.job_id}-p{part}")
    if setup.network_mask is None and not os.environ.get("PSRV_IP", "").strip():
        # no mask given: bind the interface that routes to the controller (not loopback on a cluster)
        config = config.replace(host=route_source_address(setup.controller_address))
    if sharing is not None:  # a device network: the node decodes through hooks, downloads to the host
        node = Node(config, sharing.node_params, setup.controller_address, want_updater_state=True,
                    **sharing.node_hooks())
    else:
        node = Node(config, network.params, setup.controller_address, want_updater_state=True)
    try:
        node.start()
    except TransportError as exc:
        node.stop(timeout_s=2.0)
        raise ControllerUnreachableError(
            f"worker {worker_id()} (partition {part}) could not join the psrv controller at "
            f"{setup.controller_address} (network mask {setup.network_mask!r}; set VoidConfiguration."
            f"network_mask / controller_address, or PSRV_IP): {exc}"
        ) from exc
    return node


def wait_acknowledged(node: Node, heartbeat_s: float, missed_beats: int) -> bool:
    """Stay in the mesh until the controller holds every update this node sent, so that nothing a
    relay dropped is lost when the task leaves (the node re-sends what the controller's watermark
    lacks after two silent beats). Bounded: two beats of waiting, the re-send quiet period, slack.
    """
    try:
        return node.wait_acknowledged(timeout_s=heartbeat_s * (missed_beats + 4))
    except TransportError as exc:  # the node stopped: leave without the acknowledgement
        log.warning("worker %s: no acknowledgement of its updates before leaving: %s", worker_id(), exc)
        return False


__all__ = ["route_source_address", "start_node", "wait_acknowledged"]
