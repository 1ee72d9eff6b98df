"""The driver's check that no host runs more gradient-sharing tasks at once than it has cores."""

from __future__ import annotations

import logging
import os
import socket
from types import SimpleNamespace

import pytest
from psrv.spark.driver.crowded_hosts import (
    LOCAL_WORKERS_FIX,
    CrowdingWarnings,
    crowded,
    hosts_of,
    most_at_once,
    runs_on_driver_host,
)
from psrv.spark.task.worker import host_and_cores

LOGGER = "psrv.spark.driver.crowded_hosts"


def _result(host: str, cores: int, start: float, end: float) -> SimpleNamespace:
    return SimpleNamespace(host=host, cores=cores, ran=(start, end))


def test_host_and_cores_is_what_this_process_may_use() -> None:
    host, cores = host_and_cores()
    assert host == socket.gethostname()
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert cores == expected >= 1


def test_most_at_once_counts_overlaps_not_tasks() -> None:
    assert most_at_once([]) == 0
    assert most_at_once([(0, 10), (1, 9), (2, 8)]) == 3
    assert most_at_once([(0, 1), (1, 2), (2, 3)]) == 1  # waves: one ends as the next starts
    assert most_at_once([(0, 5), (6, 9), (4, 7), (8, 12)]) == 2


def test_hosts_of_counts_per_host_what_ran_at_once() -> None:
    results = [_result("a", 2, 0, 10) for _ in range(4)] + [_result("b", 8, 0, 10)]
    results += [_result("c", 2, t, t + 1) for t in range(5)]  # five tasks in waves
    results.append(SimpleNamespace(host="", cores=0, ran=(0.0, 0.0)))  # an older task: no host
    hosts = hosts_of(results)
    assert hosts == {"a": {"tasks": 4, "cores": 2}, "b": {"tasks": 1, "cores": 8},
                     "c": {"tasks": 1, "cores": 2}}
    assert crowded(hosts) == {"a": {"tasks": 4, "cores": 2}}


@pytest.mark.parametrize(("master", "local"), [
    ("local", True), ("local[4]", True), ("local[*]", True), ("local[2,3]", True),
    ("local-cluster[8,1,1024]", True), ("spark://10.0.0.1:7077", False), ("yarn", False),
    ("k8s://https://host:443", False),
])
def test_local_masters_run_on_the_driver_host(master: str, local: bool) -> None:
    assert runs_on_driver_host(master) is local


def test_a_crowded_local_master_is_said_once_before_the_job(caplog: pytest.LogCaptureFixture) -> None:
    host, cores = host_and_cores()
    warnings = CrowdingWarnings(LOCAL_WORKERS_FIX)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        warnings.before_job("local-cluster[64,1,1024]", cores)  # one task per core: fine
        assert not caplog.records
        warnings.before_job("spark://elsewhere:7077", cores + 1)  # other hosts: known after the fit
        assert not caplog.records
        warnings.before_job("local-cluster[64,1,1024]", cores + 1)
        warnings.before_job("local-cluster[64,1,1024]", cores + 1)  # the next epoch: not again
        warnings.after_fit({host: {"tasks": cores + 1, "cores": cores}})  # nor after it
    assert len(caplog.records) == 1
    text = caplog.records[0].getMessage()
    for part in (f"{cores + 1} tasks on host {host}", f"{cores} core(s)", "late", "workers_per_node",
                 f"num_workers <= {cores}"):
        assert part in text, text


def test_a_crowded_host_is_said_after_the_fit(caplog: pytest.LogCaptureFixture) -> None:
    warnings = CrowdingWarnings()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        warnings.after_fit({"a": {"tasks": 2, "cores": 2}, "b": {"tasks": 3, "cores": 1}})
        warnings.after_fit({"b": {"tasks": 3, "cores": 1}})
    assert [r.getMessage().split(",")[0] for r in caplog.records] == \
        ["gradient sharing ran 3 tasks on host b"]


def test_without_local_workers_the_fix_is_one_task_per_core(caplog: pytest.LogCaptureFixture) -> None:
    """psrv.spark.run has no local workers: its warning names only the task count to use."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        CrowdingWarnings().after_fit({"b": {"tasks": 3, "cores": 1}})
    (record,) = caplog.records
    assert record.getMessage().endswith("num_workers <= 1 per host")
