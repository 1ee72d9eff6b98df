"""One Spark standalone cluster on network-namespace hosts per test module (see netns.py and
spark_cluster.py); skipped with the reason where namespaces cannot be built (not root, no iproute2)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.netns import Hosts, unavailable_reason
from tests.cluster.spark_cluster import HOSTS, SHAPED_HOST, SHAPED_RATE, SparkCluster


@pytest.fixture(scope="module")
def netns_cluster(tmp_path_factory) -> Iterator[SparkCluster]:
    """Master and S3 on ``head``, workers on ``w1`` and ``w2`` (w2's link shaped to 100 Mbit/s), the
    driver on ``drv``; every process and namespace removed afterwards, also when the start failed."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    workdir = tmp_path_factory.mktemp("netns-cluster")
    with Hosts(HOSTS) as hosts:
        hosts.shape(SHAPED_HOST, SHAPED_RATE)
        cluster = SparkCluster(hosts, workdir)
        try:
            cluster.start()  # S3 answering; the master and the workers may still be starting
            yield cluster
        finally:
            cluster.stop()
