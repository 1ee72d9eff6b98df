"""A Spark standalone cluster on namespace hosts, with an S3 server (moto's) as its shared store.

Hosts (see netns.py): ``head`` runs the Spark master and the S3 server, ``w1`` and ``w2`` one worker
each (one core, 1 GiB), ``drv`` the driver of every application, submitted by ``spark-submit`` as a
user would. The Spark is pip's pyspark (``bin/spark-class`` runs master and workers); executors and
drivers run the interpreter running the tests, so they import psrv from its virtual environment.
Applications see S3 as the cluster's default file system (``fs.defaultFS=s3a://psrv``, the S3A
endpoint on ``head``), so the export approach and checkpoints land there; psrv reads and writes it
with s3fs in the tasks themselves. Every wait has a deadline; ``stop()`` ends every process started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.cluster.netns import Hosts

HOSTS = ("head", "w1", "w2", "drv")
WORKERS = ("w1", "w2")
SHAPED_HOST, SHAPED_RATE = "w2", "100mbit"  # the worker host whose link is shaped (tbf both ways)
MASTER_PORT, MASTER_UI_PORT, WORKER_UI_PORT, S3_PORT = 7077, 8080, 8081, 5000
BUCKET = "psrv"
STARTUP_DEADLINE_S = 120.0
S3A = {"fs.s3a.access.key": "testing", "fs.s3a.secret.key": "testing", "fs.s3a.endpoint.region": "us-east-1",
       "fs.s3a.path.style.access": "true"}
# one HTTP request, run by the interpreter inside a host's namespace (no curl needed)
_HTTP = ("import sys, urllib.request as u; body = b'' if sys.argv[2] == 'PUT' else None; "
         "r = u.urlopen(u.Request(sys.argv[1], method=sys.argv[2], data=body), timeout=5); "
         "sys.stdout.write(r.read().decode())")


def _spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


class SparkCluster:
    """The cluster's processes on ``hosts``; logs and work folders under ``workdir``."""

    def __init__(self, hosts: Hosts, workdir: Path) -> None:
        self.hosts = hosts
        self.workdir = workdir
        self.spark_home = _spark_home()
        self.master_url = f"spark://{hosts.address('head')}:{MASTER_PORT}"
        self.s3_endpoint = f"http://{hosts.address('head')}:{S3_PORT}"
        self.processes: dict[str, subprocess.Popen] = {}

    # -- processes ------------------------------------------------------------------------------------
    def _env(self, host: str) -> dict[str, str]:
        private = self.workdir / host
        (private / "tmp").mkdir(parents=True, exist_ok=True)
        address = self.hosts.address(host)
        return {**os.environ, "SPARK_HOME": self.spark_home, "SPARK_NO_DAEMONIZE": "1",
                "SPARK_LOCAL_IP": address, "SPARK_LOCAL_HOSTNAME": address, "SPARK_DAEMON_MEMORY": "256m",
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                "TMPDIR": str(private / "tmp"), "SPARK_LOCAL_DIRS": str(private / "tmp")}

    def _start(self, name: str, host: str, argv: Sequence[str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "ab") as log:
            process = subprocess.Popen(self.hosts.argv(host, argv), env=self._env(host), stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        self.processes[name] = process
        return process

    def start(self) -> None:
        """S3 (its bucket made), the master and both workers started; returns once S3 answers, while the
        master and the workers may still be starting (``wait_workers()`` waits for them). An application
        submitted now connects to the master seconds later (a driver retries after 20 s) and waits for
        both executors before its first job."""
        head = self.hosts.address("head")
        self._start("s3", "head", [str(Path(sys.executable).with_name("moto_server")), "-H", head,
                                   "-p", str(S3_PORT)])
        self._start("master", "head", [f"{self.spark_home}/bin/spark-class",
                                       "org.apache.spark.deploy.master.Master", "--host", head, "--port",
                                       str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT)])
        for host in WORKERS:
            self.start_worker(host)
        self._until(lambda: self.http("drv", f"{self.s3_endpoint}/{BUCKET}", "PUT") is not None,
                    "the S3 server answering and its bucket created")

    def start_worker(self, host: str) -> None:
        self._start(f"worker-{host}", host, [
            f"{self.spark_home}/bin/spark-class", "org.apache.spark.deploy.worker.Worker", "--host",
            self.hosts.address(host), "--cores", "1", "--memory", "1g", "--webui-port", str(WORKER_UI_PORT),
            "--work-dir", str(self.workdir / host / "work"), self.master_url])

    def alive_workers(self) -> list[str]:
        """The addresses of the workers the master lists as ALIVE."""
        answer = self.http("head", f"http://{self.hosts.address('head')}:{MASTER_UI_PORT}/json/")
        if not answer:
            return []
        try:
            workers = json.loads(answer).get("workers", [])
        except ValueError:
            return []
        return sorted(w["host"] for w in workers if w.get("state") == "ALIVE")

    def wait_workers(self) -> None:
        """Both workers registered and alive; a worker whose host was lost is started again first."""
        for host in WORKERS:
            process = self.processes.get(f"worker-{host}")
            if process is None or process.poll() is not None:
                self.start_worker(host)
        wanted = sorted(self.hosts.address(h) for h in WORKERS)
        self._until(lambda: self.alive_workers() == wanted, f"workers {wanted} alive at the master")

    def http(self, host: str, url: str, method: str = "GET") -> str | None:
        """The body of an HTTP request made from inside ``host`` (None when it failed)."""
        done = self.hosts.run(host, [sys.executable, "-c", _HTTP, url, method], timeout=15, check=False)
        return done.stdout if done.returncode == 0 else None

    def _until(self, condition, what: str) -> None:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while not condition():
            dead = [n for n, p in self.processes.items() if p.poll() is not None and not n.startswith("app")]
            if time.monotonic() > deadline or dead:
                raise TimeoutError(f"no {what} within {STARTUP_DEADLINE_S:.0f} s (exited: {dead}); "
                                   f"logs in {self.workdir}: {self.log_tails()}")
            time.sleep(0.5)

    def log_tails(self, chars: int = 1500) -> str:
        return " | ".join(f"{p.name}: {p.read_text(errors='replace')[-chars:]}"
                          for p in sorted(self.workdir.glob("*.log")))

    # -- applications ---------------------------------------------------------------------------------
    def submit_argv(self, script: Path, *args: str, py_files: Sequence[Path] = ()) -> list[str]:
        """``spark-submit`` of ``script`` from the driver's host to the standalone master; its first job
        waits until both workers' executors registered (at most ``STARTUP_DEADLINE_S``)."""
        drv = self.hosts.address("drv")
        conf = {"spark.driver.host": drv, "spark.driver.bindAddress": drv, "spark.ui.enabled": "false",
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{STARTUP_DEADLINE_S:.0f}s",
                "spark.ui.showConsoleProgress": "false", "spark.driver.memory": "768m",
                "spark.executor.memory": "768m", "spark.executor.cores": "1", "spark.cores.max": "2",
                "spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable,
                "spark.sql.warehouse.dir": (self.workdir / "warehouse").as_uri(),
                "spark.executorEnv.NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", ""),
                "spark.hadoop.fs.defaultFS": f"s3a://{BUCKET}",
                "spark.hadoop.fs.s3a.endpoint": self.s3_endpoint,
                **{f"spark.hadoop.{key}": value for key, value in S3A.items()}}
        argv = [str(Path(sys.executable).with_name("spark-submit")), "--master", self.master_url]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        if py_files:
            argv += ["--py-files", ",".join(map(str, py_files))]
        return [*argv, str(script), *args]

    def submit(self, name: str, script: Path, *args: str, py_files: Sequence[Path] = ()) -> subprocess.Popen:
        """Start an application; its output goes to ``<workdir>/<name>.log``."""
        self.processes.pop(name, None)
        return self._start(name, "drv", self.submit_argv(script, *args, py_files=py_files))

    def wait(self, name: str, timeout: float) -> int:
        """The application's exit code; it is killed when it runs past ``timeout``."""
        process = self.processes[name]
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._end(process)
            log = (self.workdir / f"{name}.log").read_text(errors="replace")
            raise TimeoutError(f"{name} ran past {timeout:.0f} s: {log[-3000:]}") from None

    # -- stopping -------------------------------------------------------------------------------------
    @staticmethod
    def _end(process: subprocess.Popen) -> None:
        if process.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            self._end(process)


__all__ = ["BUCKET", "HOSTS", "SHAPED_HOST", "SHAPED_RATE", "WORKERS", "SparkCluster"]
