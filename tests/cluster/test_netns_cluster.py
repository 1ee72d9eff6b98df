"""psrv on a real multi-host Spark cluster: each host its own network namespace, link and address.

The cluster (conftest.py): a standalone master and an S3 server on ``head``, one worker on each of
``w1`` and ``w2`` (w2's link shaped to 100 Mbit/s), applications submitted by ``spark-submit`` from
``drv``; S3 is the default file system, so exports and checkpoints go there. Each test submits an
application as a user would and reads what it wrote; the fault tests cut or kill a worker's host
while its task trains.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.cluster.spark_cluster import BUCKET, WORKERS, SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SHARING_RUN = Path(__file__).with_name("sharing_run.py")
APP_DEADLINE_S = 480.0
MARK_DEADLINE_S = APP_DEADLINE_S
CUT_S = 10.0
README_EPILOGUE = '''
# --- appended by tests/cluster/test_netns_cluster.py ---
import json as _json
import sys as _sys

_rows = model.transform(df).select("label", "prediction").collect()
_ones = sum(int(r.label) for r in _rows)
_infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
with open(_sys.argv[1], "w") as _out:
    _json.dump({"rows": len(_rows), "count": df.count(),
                "accuracy": sum(int(r.label) == int(r.prediction) for r in _rows) / max(1, len(_rows)),
                "majority": max(_ones, len(_rows) - _ones) / max(1, len(_rows)),
                "hosts": sorted(str(i.host()) for i in _infos)}, _out)
spark.stop()
'''


def readme_example() -> str:
    """The first python block after README's ``example: first-screen`` marker."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- example: first-screen.*?-->\s*```python\n(.*?)```", text, re.S)
    assert found, "README.md: no ```python block after <!-- example: first-screen -->"
    return found.group(1)


def _result(cluster: SparkCluster, name: str, out: Path) -> dict:
    code = cluster.wait(name, APP_DEADLINE_S)
    log = (cluster.workdir / f"{name}.log").read_text(errors="replace")
    assert code == 0 and out.exists(), f"{name} exited {code}: {log[-4000:]}"
    result = json.loads(out.read_text())
    assert "error" not in result, (result, log[-4000:])
    return result


def _minibatches_stored(cluster: SparkCluster) -> list[str]:
    """The minibatch files written to the S3 server so far, from its request log (exports are removed
    when the fit ends, so a listing afterwards would find none)."""
    log = (cluster.workdir / "s3.log").read_text(errors="replace")
    return re.findall(rf'"PUT /{BUCKET}/(\S+\.psds) HTTP', log)


def _wait_for_mark(cluster: SparkCluster, name: str, marks: Path) -> str:
    """The worker host whose task reached the marked step (the application still running)."""
    deadline = time.monotonic() + MARK_DEADLINE_S
    mark = marks / "mark"
    while not mark.exists():
        process = cluster.processes[name]
        log = cluster.workdir / f"{name}.log"
        assert process.poll() is None, f"{name} ended before the marked step: {log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no task reached the marked step in {MARK_DEADLINE_S:.0f} s"
        time.sleep(0.1)
    address = mark.read_text().strip()
    hosts = {cluster.hosts.address(h): h for h in WORKERS}
    assert address in hosts, f"the marked task ran on {address!r}, not on a worker host {hosts}"
    return hosts[address]


def _sharing_run(cluster: SparkCluster, tmp_path: Path, name: str, pace_s: float, mark_step: int,
                 epochs: int) -> tuple[Path, Path]:
    cluster.wait_workers()
    out, marks = tmp_path / f"{name}.json", tmp_path / "marks"
    marks.mkdir()
    cluster.submit(name, SHARING_RUN, str(out), str(marks), cluster.hosts.mask, str(pace_s), str(mark_step),
                   str(epochs))
    return out, marks


def test_readme_first_example_by_spark_submit_trains_and_scores(netns_cluster: SparkCluster,
                                                               tmp_path: Path) -> None:
    cluster = netns_cluster
    script = tmp_path / "first_screen.py"
    body = readme_example()
    assert body.rstrip().endswith("spark.stop()")
    script.write_text(body.rstrip()[: -len("spark.stop()")] + README_EPILOGUE)
    out = tmp_path / "first_screen.json"
    before = len(_minibatches_stored(cluster))
    cluster.wait_workers()
    cluster.submit("app-readme", script, str(out))
    result = _result(cluster, "app-readme", out)
    # the driver and one executor on each worker host, each at its namespace's address
    addresses = {cluster.hosts.address(h) for h in ("drv", *WORKERS)}
    assert set(result["hosts"]) == addresses and len(result["hosts"]) == 3, result
    # every row scored; clearly better than always guessing the larger class
    assert result["rows"] == result["count"] == 2000, result
    assert result["accuracy"] >= result["majority"] + 0.25, result
    # the minibatches went to the shared store (the cluster's default file system), not a local folder
    exported = _minibatches_stored(cluster)[before:]
    assert exported and all(k.startswith("tmp/psrv-export/") for k in exported), exported


def test_worker_link_cut_for_10_s_mid_fit_loses_nothing(netns_cluster: SparkCluster, tmp_path: Path) -> None:
    cluster, hosts = netns_cluster, netns_cluster.hosts
    before = len(_minibatches_stored(cluster))
    out, marks = _sharing_run(cluster, tmp_path, "app-cut", pace_s=0.2, mark_step=8, epochs=2)
    host = _wait_for_mark(cluster, "app-cut", marks)
    hosts.cut(host)
    try:
        time.sleep(CUT_S)
    finally:
        hosts.heal(host)
    result = _result(cluster, "app-cut", out)
    first, second = result["fits"]
    print(f"link of {host} cut {CUT_S:.0f} s: {json.dumps(result)}")
    # psrv bound the namespace's cluster address (inside the mask), not the decoy or loopback
    assert first["controller"].startswith(hosts.address("drv") + ":"), first
    for fit in (first, second):
        assert fit["workers"] == 2 and fit["examples"] == result["rows"], fit
        assert fit["replicas_checked"] == 2 and fit["replicas_diverged"] == 0, fit
        assert fit["retried_partitions"] == [], fit
    assert result["accuracy"] >= result["majority"] + 0.25, result
    # the minibatches and one checkpoint per epoch on the shared store
    exported = _minibatches_stored(cluster)[before:]  # exported once for both epochs, 16 examples each
    assert len(exported) == first["steps"] == result["rows"] // 16, (len(exported), first)
    # (under the run's own folder, beside the marker that says which run wrote last)
    names = [p.rsplit("/", 1)[-1] for p in result["checkpoints"] if not p.endswith("/latest-run")]
    assert len(set(names)) == 2 and all(n.endswith(".psrvckpt") for n in names), result["checkpoints"]
    assert all(p.startswith(f"s3a://{BUCKET}/checkpoints/") for p in result["checkpoints"]), result
    # nothing applied twice: the master applied what the accounting reports ...
    assert first["controller_updates_applied"] == (
        first["messages"] - first["updates_missing"] + first["updates_applied_by_failed_attempts"]), first
    # ... and every update the cut worker sent, before, during and after the cut, reached the master copy
    assert first["updates_missing"] == 0, first


def test_worker_host_killed_mid_fit_is_retried_and_nothing_applied_twice(netns_cluster: SparkCluster,
                                                                         tmp_path: Path) -> None:
    cluster, hosts = netns_cluster, netns_cluster.hosts
    out, marks = _sharing_run(cluster, tmp_path, "app-kill", pace_s=0.05, mark_step=10, epochs=1)
    host = _wait_for_mark(cluster, "app-kill", marks)
    killed = hosts.kill_all(host)  # the worker daemon, the executor and its Python workers
    assert len(killed) >= 3, killed
    # (a test after this one starts the lost host's worker again: each begins with wait_workers())
    result = _result(cluster, "app-kill", out)
    (fit,) = result["fits"]
    print(f"processes of {host} killed: {json.dumps(result)}")
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
