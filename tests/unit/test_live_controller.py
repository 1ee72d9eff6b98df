"""The controller kept across the epochs of one fit call, with a real controller and real nodes
on loopback, without Spark: each epoch's counters are its own, the master copy survives between epochs,
the driver's changes and updater state reach it, and a replica check acknowledges a node's updates."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.encoding import ResidualEncoder
from psrv.nn import Adam, Dense, Network, Output
from psrv.server import Controller, Node
from psrv.spark.driver.live_controller import LiveController
from psrv.transport import TransportConfig

pytestmark = [pytest.mark.timeout(60)]


def _epoch(config: TransportConfig, address: str, network: Network, updates: int, seed: int) -> int:
    """One "task": a node joins, submits ``updates`` encoded updates, checks its replica, leaves."""
    node = Node(config.replace(node_name=f"task-{seed}"), np.array(network.params, copy=True), address)
    node.start()
    encoder = ResidualEncoder(network.num_params, dtype=network.params.dtype)
    rng = np.random.default_rng(seed)
    sent = 0
    try:
        while sent < updates:
            message = encoder.encode_update(rng.normal(size=network.num_params).astype(network.params.dtype))
            if message is not None:
                node.submit(message, apply_locally=True)
                sent += 1
        check = node.check_replica(timeout_s=10.0)
        assert check.status == "equal", check
        # the check's snapshot acknowledged every update: no wait for a heartbeat (1 h here)
        assert node.wait_acknowledged(timeout_s=0.0)
        return int(node.ids_held[-1])
    finally:
        node.stop()


def test_kept_controller_counts_each_epoch_apart_and_keeps_the_master_copy() -> None:
    network = Network([Dense(8, activation="relu"), Output(3)], input_shape=(5,), updater=Adam(1e-2), seed=3)
    config = TransportConfig(host="127.0.0.1", port=0, heartbeat_s=3600.0)
    controller = Controller(config, np.array(network.params, copy=True),
                            updater_state=np.array(network.updater_state, copy=True))
    controller.start()
    live = LiveController(controller, controller.address, None, kept=True,
                          handed=np.array(network.params, copy=True))
    try:
        origins = []
        for epoch, updates in enumerate((7, 4)):
            live.begin_epoch(network)
            origins.append(_epoch(config, controller.address, network, updates, seed=epoch))
            counters = live.epoch_counters()
            assert counters["updates_applied"] == updates and counters["joins"] == 1, counters
            assert counters["applied_by_origin"] == {origins[-1]: updates}, counters
            with controller.lock:
                network.set_params(np.array(controller.params, copy=True))
            live.end_epoch(network)
        assert live.epochs == 2

        # unchanged driver parameters: a late update on the master copy is kept, not overwritten
        with controller.lock:
            controller.params[0] += 1.0
            late = np.array(controller.params, copy=True)
        network.set_updater_state(np.full_like(network.updater_state, 0.5))
        live.begin_epoch(network)
        np.testing.assert_array_equal(controller.params, late)
        np.testing.assert_array_equal(controller.updater_state, network.updater_state)
        # parameters the driver changed (a callback) replace the master copy
        network.set_params(np.zeros_like(network.params))
        live.begin_epoch(network)
        np.testing.assert_array_equal(controller.params, np.zeros_like(network.params))
    finally:
        controller.stop()
