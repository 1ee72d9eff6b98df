"""More gradient-sharing tasks on a host than it has cores: said on the driver, before and after a fit.

The tasks of a gradient-sharing job are asynchronous: each steps as fast as its core lets it and applies
the others' updates when they arrive. Where more tasks run on a host than it has cores, they take turns
on the cores, and each one's updates reach the others several of their steps late. Updates that late,
summed on every replica, cost accuracy that no threshold setting wins back: on the 1 M-parameter MLP at
8 workers, real Spark with 8 executors on 2 cores ended at 14-52 % test accuracy where one process
reaches 55 %, and the quality harness shows the same loss once messages arrive 1-3 steps late, also
with no quantization at all (README, "How much a step learns"). Several trainers in one task
(``workers_per_node``) step together and send one combined update, so they add no such delay.

The driver says so before the job where it knows the host (a ``local`` or ``local-cluster`` master runs
every executor on the driver's host) and after each fit from what every task reported of its host
(``last_fit["hosts"]``: per host the most tasks it ran at once and its cores). ``psrv.spark.run``
starts its tasks together (a barrier stage): it says so before the job for a local master.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from psrv.spark.task.worker import host_and_cores

log = logging.getLogger(__name__)


def runs_on_driver_host(master: str) -> bool:
    """Whether every executor of ``master`` runs on the driver's host (``local[...]``, ``local-cluster``)."""
    master = master.strip()
    return master == "local" or master.startswith(("local[", "local-cluster["))


def hosts_of(results: Iterable[Any]) -> dict[str, dict[str, int]]:
    """Per host: the most tasks that ran on it at once (``tasks``; from each result's ``ran``, the start
    and end on its host's clock: tasks in waves do not add up), and its ``cores``. A result without
    ``host`` and ``cores`` (an older task's) is left out."""
    spans: dict[str, list[tuple[float, float]]] = {}
    cores: dict[str, int] = {}
    for result in results:
        host, count = getattr(result, "host", ""), int(getattr(result, "cores", 0) or 0)
        if not host or count < 1:
            continue
        spans.setdefault(host, []).append(tuple(getattr(result, "ran", (0.0, 0.0))))
        cores[host] = max(cores.get(host, 0), count)
    return {host: {"tasks": most_at_once(spans[host]), "cores": cores[host]} for host in spans}


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most of these (start, end) intervals that overlap at one time (one that ends as another
    starts does not overlap it)."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])  # ends first
    running = most = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


def crowded(hosts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The hosts that ran more tasks than they have cores."""
    return {host: entry for host, entry in hosts.items() if entry["tasks"] > entry["cores"]}


def advice(host: str, tasks: int, cores: int, when: str, fix: str = "") -> str:
    """What the warning says: what happened, why it matters, and what to change (``fix``: the way to
    more workers without more tasks, where the caller has one)."""
    return (f"gradient sharing {when} {tasks} tasks on host {host}, which has {cores} core(s): the tasks "
            f"take turns on the cores, their updates reach each other several steps late, and late "
            f"updates summed on every replica cost accuracy (README: 'How much a step learns'). Give each "
            f"task a core: num_workers <= {cores} per host{fix}")


#: SharedTrainingMaster's way to more workers than tasks
LOCAL_WORKERS_FIX = (", e.g. fewer executors, or several trainers in each task with "
                     "SharedTrainingMaster(workers_per_node=N)")


class CrowdingWarnings:
    """Warns once per host for one training master (every epoch would say the same)."""

    def __init__(self, fix: str = "") -> None:
        self.warned: set[str] = set()
        self.fix = fix

    def before_job(self, master: str, tasks: int) -> None:
        """A local master: every task runs on this host, known before the job starts."""
        if not runs_on_driver_host(master):
            return
        host, cores = host_and_cores()
        if tasks > cores and host not in self.warned:
            self.warned.add(host)
            log.warning(advice(host, tasks, cores, "will run", self.fix))

    def after_fit(self, hosts: dict[str, dict[str, int]]) -> None:
        for host, entry in crowded(hosts).items():
            if host not in self.warned:
                self.warned.add(host)
                log.warning(advice(host, entry["tasks"], entry["cores"], "ran", self.fix))


__all__ = ["LOCAL_WORKERS_FIX", "CrowdingWarnings", "advice", "crowded", "hosts_of", "most_at_once",
           "runs_on_driver_host"]
