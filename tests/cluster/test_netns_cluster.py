"""psrv on a real multi-host Spark cluster: each host its own network namespace, link and address.

The cluster (conftest.py): a standalone master and an S3 server on ``head``, one worker on each of
``w1`` and ``w2`` (w2's link shaped to 100 Mbit/s); S3 is the default file system, so exports and
checkpoints go there. One application, submitted by ``spark-submit`` from ``drv`` as a user would,
runs README's first example (the block verbatim, then a few lines that write its scores) and then two
gradient-sharing fits (sharing_run.py, shipped with ``--py-files``). The module's fixture submits it
and applies the faults when the application signals, by a file, that partition 0's task reached the
marked step: during the first fit it cuts that host's link for 10 s, during the second it kills every
process of that host. Each test checks one guarantee from what the application wrote; one
application instead of three starts one driver and one executor per worker host once.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cluster.spark_cluster import BUCKET, SHAPED_HOST, WORKERS, SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SHARING_RUN = Path(__file__).with_name("sharing_run.py")
APP = "app"
APP_DEADLINE_S = 720.0  # the whole application, from its submission (three fits, a loaded 2-core box)
CUT_S = 10.0
# the fault fits, in order: name -> (sleep after each step of the first epoch, marked step, epochs)
PHASES = {"cut": (0.2, 8, 2), "kill": (0.05, 10, 1)}
README_EPILOGUE = '''
# --- appended by tests/cluster/test_netns_cluster.py: the example's scores, then the fault fits ---
import json as _json
import sys as _sys

import sharing_run as _sharing_run  # shipped with --py-files

_rows = model.transform(df).select("label", "prediction").collect()
_ones = sum(int(r.label) for r in _rows)
_infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
with open(_sys.argv[1] + "/readme.json", "w") as _out:
    _json.dump({"rows": len(_rows), "count": df.count(),
                "accuracy": sum(int(r.label) == int(r.prediction) for r in _rows) / max(1, len(_rows)),
                "majority": max(_ones, len(_rows) - _ones) / max(1, len(_rows)),
                "hosts": sorted(str(i.host()) for i in _infos)}, _out)
_sharing_run.fault_fits(spark, *_sys.argv[1:])
spark.stop()
'''


def readme_example() -> str:
    """The first python block after README's ``example: first-screen`` marker."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- example: first-screen.*?-->\s*```python\n(.*?)```", text, re.S)
    assert found, "README.md: no ```python block after <!-- example: first-screen -->"
    return found.group(1)


@dataclass
class ClusterRun:
    """What the application wrote and what the fixture did to it."""

    cluster: SparkCluster
    out: Path
    code: int | None = None
    hit: dict[str, str] = field(default_factory=dict)  # fault phase -> the worker host cut or killed
    problems: dict[str, str] = field(default_factory=dict)  # fault phase -> why no fault was applied
    killed: list[int] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # since submission, when each step was seen

    def log_tail(self, chars: int = 4000) -> str:
        return (self.cluster.workdir / f"{APP}.log").read_text(errors="replace")[-chars:]

    def result(self, phase: str) -> dict:
        path = self.out / f"{phase}.json"
        assert path.exists(), f"no {path.name} (the application exited {self.code}): {self.log_tail()}"
        result = json.loads(path.read_text())
        assert "error" not in result, (result, self.log_tail())
        return result

    def exports(self) -> list[list[str]]:
        """The minibatch files each fit exported to the S3 server, one list per export folder in the
        order they were written, from the server's request log (exports are removed when the fit
        ends, so a listing afterwards would find none)."""
        log = (self.cluster.workdir / "s3.log").read_text(errors="replace")
        folders: dict[str, list[str]] = {}
        for key in re.findall(rf'"PUT /{BUCKET}/(\S+\.psds) HTTP', log):
            folders.setdefault(key.rsplit("/", 1)[0], []).append(key)
        return list(folders.values())


def _wait_for_mark(run: ClusterRun, phase: str, marks: Path, deadline: float) -> str | None:
    """The worker host whose task reached the phase's marked step, or None (the reason kept in
    ``run.problems``) when the phase or the application ended first, or the deadline passed."""
    process = run.cluster.processes[APP]
    while not (marks / "mark").exists():
        if process.poll() is not None:
            run.problems[phase] = f"the application exited {process.returncode} before the marked step"
        elif (run.out / f"{phase}.json").exists():
            run.problems[phase] = "the fit ended without reaching the marked step"
        elif time.monotonic() > deadline:
            run.problems[phase] = f"no task reached the marked step within {APP_DEADLINE_S:.0f} s"
        if phase in run.problems:
            run.problems[phase] += f": {run.log_tail()}"
            return None
        time.sleep(0.1)
    address = (marks / "mark").read_text().strip()
    hosts = {run.cluster.hosts.address(h): h for h in WORKERS}
    if address not in hosts:
        run.problems[phase] = f"the marked task ran on {address!r}, not on a worker host {hosts}"
        return None
    run.hit[phase] = hosts[address]
    return hosts[address]


@pytest.fixture(scope="module")
def cluster_run(netns_cluster: SparkCluster, tmp_path_factory) -> ClusterRun:
    """The application submitted (while the master and the workers still start), the link of the host training
    partition 0 cut for ``CUT_S`` at the first fit's mark, every process of the host training it
    killed at the second fit's mark, and the application's end awaited (each wait with a deadline)."""
    cluster = netns_cluster
    work = tmp_path_factory.mktemp("cluster-run")
    body = readme_example()
    assert body.rstrip().endswith("spark.stop()")
    script = work / "first_screen.py"
    script.write_text(body.rstrip()[: -len("spark.stop()")] + README_EPILOGUE)
    out, marks = work / "out", work / "marks"
    out.mkdir()
    for phase in PHASES:
        (marks / phase).mkdir(parents=True)
    phases = [f"{name}:{pace}:{step}:{epochs}" for name, (pace, step, epochs) in PHASES.items()]
    started = time.monotonic()
    deadline = started + APP_DEADLINE_S
    cluster.submit(APP, script, str(out), str(marks), cluster.hosts.mask, *phases, py_files=[SHARING_RUN])
    run = ClusterRun(cluster, out)
    cluster.wait_workers()
    run.seconds["workers alive"] = time.monotonic() - started

    host = _wait_for_mark(run, "cut", marks / "cut", deadline)
    if host is not None:
        run.seconds["cut"] = time.monotonic() - started
        cluster.hosts.cut(host)
        try:
            (marks / "cut" / "go").touch()  # the task trains on while the link is down
            time.sleep(CUT_S)
        finally:
            cluster.hosts.heal(host)
    host = _wait_for_mark(run, "kill", marks / "kill", deadline)
    if host is not None:
        run.seconds["kill"] = time.monotonic() - started
        run.killed = cluster.hosts.kill_all(host)  # the worker daemon, the executor and its Python workers
        (marks / "kill" / "go").touch()
    run.code = cluster.wait(APP, max(1.0, deadline - time.monotonic()))
    run.seconds["application ended"] = time.monotonic() - started
    print(f"cluster application: {json.dumps(run.seconds)}")
    return run


def test_readme_first_example_by_spark_submit_trains_and_scores(cluster_run: ClusterRun) -> None:
    run = cluster_run
    result = run.result("readme")
    # the driver and one executor on each worker host, each at its namespace's address
    addresses = {run.cluster.hosts.address(h) for h in ("drv", *WORKERS)}
    assert set(result["hosts"]) == addresses and len(result["hosts"]) == 3, result
    # one worker host's link shaped to 100 Mbit/s all along (tbf on its interface)
    qdisc = run.cluster.hosts.qdisc(SHAPED_HOST)
    assert re.search(r"qdisc tbf .*rate 100Mbit", qdisc), qdisc
    # every row scored; clearly better than always guessing the larger class
    assert result["rows"] == result["count"] == 2000, result
    assert result["accuracy"] >= result["majority"] + 0.25, result
    # the minibatches went to the shared store (the cluster's default file system), not a local folder
    exports = run.exports()
    assert exports and all(k.startswith("tmp/psrv-export/") for k in exports[0]), exports


def test_worker_link_cut_for_10_s_mid_fit_loses_nothing(cluster_run: ClusterRun) -> None:
    run, hosts = cluster_run, cluster_run.cluster.hosts
    assert "cut" not in run.problems, run.problems["cut"]
    result = run.result("cut")
    first, second = result["fits"]
    print(f"link of {run.hit['cut']} cut {CUT_S:.0f} s: {json.dumps(result)}")
    # psrv bound the namespace's cluster address (inside the mask), not the decoy or loopback
    assert first["controller"].startswith(hosts.address("drv") + ":"), first
    for fit in (first, second):
        assert fit["workers"] == 2 and fit["examples"] == result["rows"], fit
        assert fit["replicas_checked"] == 2 and fit["replicas_diverged"] == 0, fit
        assert fit["retried_partitions"] == [], fit
    assert result["accuracy"] >= result["majority"] + 0.25, result
    # the minibatches (the second export folder: README's example wrote the first) and one checkpoint
    # per epoch on the shared store
    exports = run.exports()
    assert len(exports) >= 2, exports
    assert len(exports[1]) == first["steps"] == result["rows"] // 16, (len(exports[1]), first)  # 16 a file
    # (under the run's own folder, beside the marker that says which run wrote last)
    names = [p.rsplit("/", 1)[-1] for p in result["checkpoints"] if not p.endswith("/latest-run")]
    assert len(set(names)) == 2 and all(n.endswith(".psrvckpt") for n in names), result["checkpoints"]
    assert all(p.startswith(f"s3a://{BUCKET}/checkpoints/") for p in result["checkpoints"]), result
    # nothing applied twice: the master applied what the accounting reports ...
    assert first["controller_updates_applied"] == (
        first["messages"] - first["updates_missing"] + first["updates_applied_by_failed_attempts"]), first
    # ... and every update the cut worker sent, before, during and after the cut, reached the master copy
    assert first["updates_missing"] == 0, first


def test_worker_host_killed_mid_fit_is_retried_and_nothing_applied_twice(cluster_run: ClusterRun) -> None:
    run = cluster_run
    assert "kill" not in run.problems, run.problems["kill"]
    assert len(run.killed) >= 3, run.killed  # the worker daemon, the executor and its Python workers
    result = run.result("kill")
    (fit,) = result["fits"]
    print(f"processes of {run.hit['kill']} killed: {json.dumps(result)}")
    # Spark ran partition 0 again on the other host; the fit covers every example once
    assert fit["retried_partitions"] == [0], fit
    assert fit["workers"] == 2 and fit["examples"] == result["rows"], fit
    assert fit["replicas_checked"] == 2 and fit["replicas_diverged"] == 0, fit
    # the killed attempt's updates stay on the master copy, counted apart; the master applied exactly
    # what the accounting reports: nothing twice, nothing of the finished attempts missing
    assert fit["updates_applied_by_failed_attempts"] > 0, fit
    assert fit["controller_updates_applied"] == (
        fit["messages"] - fit["updates_missing"] + fit["updates_applied_by_failed_attempts"]), fit
    assert fit["updates_missing"] == 0, fit
    assert result["accuracy"] >= result["majority"] + 0.25, result
    # the application went on with the surviving executor and ended cleanly
    assert run.code == 0, run.log_tail()
