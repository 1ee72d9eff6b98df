"""The gradient-sharing controller's port: any free port by default, so two fits on one driver host run at
once (they used to share the fixed 40123: the second failed with "Address already in use"), and a fixed
port that is taken is refused naming the option that changes it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output
from psrv.server import Controller
from psrv.spark import SharedTrainingMaster, SparkNetwork, VoidConfiguration
from psrv.spark.errors import SparkConfigError
from psrv.transport import TransportConfig

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def _fit(spark_context, rdd, conf: VoidConfiguration) -> tuple[Network, SharedTrainingMaster]:
    network = Network([Dense(16, activation="relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2),
                      seed=4)
    master = SharedTrainingMaster(conf, batch_size_per_worker=32, num_workers=1,
                                  threshold_algorithm=AdaptiveThreshold(3e-2), progress=False)
    SparkNetwork(spark_context, network, master).fit(rdd)
    return network, master


def test_two_fits_at_once_on_one_driver_each_get_their_own_port(spark_context, digits) -> None:
    train, _ = digits
    rdd = spark_context.parallelize(list(train.subset(slice(0, 256)).batches(64)), 1)
    assert VoidConfiguration().unicast_port == 0
    outcomes: dict[int, object] = {}
    barrier = threading.Barrier(2, timeout=120)

    def fit(i: int) -> None:
        try:
            barrier.wait()
            outcomes[i] = _fit(spark_context, rdd, VoidConfiguration(heartbeat_ms=500))
        except BaseException as exc:  # handed to the test thread
            outcomes[i] = exc

    threads = [threading.Thread(target=fit, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(400)
    assert not any(t.is_alive() for t in threads), "a fit did not finish within 400 s"
    for i in range(2):
        assert isinstance(outcomes[i], tuple), outcomes[i]
        network, master = outcomes[i]
        assert master.last_fit["examples"] == 256 and master.last_fit["updates_missing"] == 0
        assert np.isfinite(network.params).all()


def test_a_taken_fixed_port_names_the_option_and_a_range_skips_it(spark_context, digits) -> None:
    train, _ = digits
    rdd = spark_context.parallelize(list(train.subset(slice(0, 128)).batches(64)), 1)
    with Controller(TransportConfig(host="127.0.0.1"), np.zeros(4, np.float32)) as taken:
        port = int(taken.address.rsplit(":", 1)[1])
        with pytest.raises(SparkConfigError, match=rf"port {port} is already in use.*unicast_port=0"):
            _fit(spark_context, rdd, VoidConfiguration(unicast_port=port))
        _, master = _fit(spark_context, rdd, VoidConfiguration(unicast_port=(port, port + 20)))
        assert master.last_fit["examples"] == 128
    with pytest.raises(SparkConfigError, match="unicast_port: expected an int in 0..65535"):
        VoidConfiguration(unicast_port=(10, 5))
