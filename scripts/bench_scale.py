"""How many workers of a large model one controller serves: N `psrv node` processes joining at once.

For each mesh mode (PLAIN, MESH) and each N, one real `psrv controller` (CurveZMQ on unless
--insecure) and N `psrv node` processes start together on loopback, all with --wait-nodes N, so
every node downloads the master copy at the same moment (the join burst of a Spark fit), then each
sends --updates sparse encoded updates (--sparsity of the P parameters; --rate per second, 0 = as
fast as it can). Measured per run:

- catch-up: from the first node's join to the last node's "caught up" (the nodes' logs);
- per-worker rate: updates per second per worker delivered to every replica: the updates the
  least-served node applied / (N - 1) / the time from the first update any node sent to the last
  one any node applied (the nodes' own clocks, from their JSON lines);
- the controller's CPU (cores busy, from its process times sampled every 0.5 s) over that window;
- the longest gap between two controller beats any node saw, and members lost (offline at the
  controller, or a node that lost the controller);
- whether the replicas end equal: every node's dump against the master copy's (max |diff|).

A second table compares `psrv node`'s synthetic generator (sparse messages drawn directly) with the
old path (a dense random residual through the encoder) for P parameters, in the same run.

    .venv/bin/python scripts/bench_scale.py                       # 4, 8, 14 nodes where cores allow
    .venv/bin/python scripts/bench_scale.py --nodes 2,4 --params 11000000 --updates 200 --rate 0

Progress goes to stderr, the tables (markdown) to stdout. Medians where a figure repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def say(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def log_times(path: Path, needle: str) -> list[float]:
    """Timestamps (epoch seconds) of the log lines of ``path`` containing ``needle``."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = LOG_TIME.match(line)
        if m and needle in line:
            out.append(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return out


@dataclass
class Run:
    mode: str
    nodes: int
    catch_up_s: float | None
    rate_per_worker: float
    delivered: bool
    controller_cores: float
    beat_gap_max_s: float
    lost: int
    replica_diff: float | None
    applied: int
    expected: int


class Daemons:
    """The controller and nodes of one run; every process is stopped (then killed) at close()."""

    def __init__(self, tmp: Path, args: argparse.Namespace) -> None:
        self.tmp, self.args = tmp, args
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", PSRV_KEYS_DIR=str(tmp / "keys"))

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        security = ["--insecure"] if self.args.insecure else ["--keys", str(self.tmp / "keys")]
        proc = subprocess.Popen(
            [sys.executable, "-m", "psrv.server.cli", "--log-level", "INFO", *argv, *security],
            stdout=open(self.tmp / f"{name}.out", "w"),  # noqa: SIM115 - the child holds it
            stderr=open(self.tmp / f"{name}.log", "w"),  # noqa: SIM115
            env=self.env,
        )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, timeout_s: float = 30.0) -> int | None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5.0)
            return None

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5.0)


def status(address: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from psrv.transport import TransportConfig
    from psrv.transport.client import request_status

    keys = None if args.insecure else str(tmp / "keys")
    return request_status(address, TransportConfig(keys_dir=keys), timeout_s=10.0)


def json_line(path: Path) -> dict[str, Any]:
    lines = [line for line in path.read_text().splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def one_run(mode: str, n: int, args: argparse.Namespace) -> Run:
    from psrv.transport.keys import generate_keys, write_keys

    tmp = Path(tempfile.mkdtemp(prefix=f"bench_scale_{mode}{n}_"))
    if not args.insecure:
        write_keys(generate_keys(), tmp / "keys")
    daemons = Daemons(tmp, args)
    try:
        ctrl = daemons.spawn(
            "controller",
            ["controller", "--port", "0", "--params", str(args.params), "--mesh", mode,
             "--fan-out", str(args.fan_out), "--heartbeat-ms", str(args.heartbeat_ms),
             "--missed-beats", str(args.missed_beats), "--dump", str(tmp / "controller.npy")],
        )
        deadline = time.monotonic() + 60
        address = None
        while address is None and time.monotonic() < deadline and ctrl.poll() is None:
            text = (tmp / "controller.out").read_text()
            if "listening on" in text:
                address = text.split("listening on", 1)[1].split()[0]
            time.sleep(0.1)
        if address is None:
            log = (tmp / "controller.log").read_text()[-2000:]
            raise RuntimeError(f"the controller did not start: {log}")
        nodes = [
            daemons.spawn(
                f"node{i}",
                ["node", "--controller", address, "--updates", str(args.updates), "--rate", str(args.rate),
                 "--sparsity", str(args.sparsity), "--seed", str(i), "--name", f"w{i}",
                 "--wait-nodes", str(n), "--join-timeout", "120", "--dump", str(tmp / f"node{i}.npy")],
            )
            for i in range(n)
        ]
        say(f"  {mode} x{n}: {n} nodes started against {address}")
        expected = n * args.updates
        ctrl_ps = psutil.Process(ctrl.pid)
        cpu_samples: list[tuple[float, float]] = []  # (epoch s, controller CPU s)
        done_at = None
        last: dict[str, Any] = {}
        deadline = time.monotonic() + args.deadline
        while time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                last = status(address, args, tmp)
            except Exception as exc:  # noqa: BLE001 - a busy controller: ask again
                say(f"    status: {exc}")
                continue
            times = ctrl_ps.cpu_times()
            cpu_samples.append((time.time(), times.user + times.system))
            online = [x for x in last["nodes"] if x["state"] == "online"]
            sent = sum(x["stats"].get("synthetic_sent", 0) for x in online)
            applied = [x["stats"].get("updates_applied", 0) for x in online]
            say(f"    {len(online)}/{n} online, {sent} sent, master {last['counters']['updates_applied']}"
                f"/{expected}, nodes applied min {min(applied, default=0)}/{(n - 1) * args.updates}")
            if (
                len(online) == n
                and last["counters"]["updates_applied"] >= expected
                and min(applied) >= (n - 1) * args.updates
            ):
                done_at = time.monotonic()
                break
            if all(p.poll() is not None for p in nodes):
                break
        times = ctrl_ps.cpu_times()
        cpu_samples.append((time.time(), times.user + times.system))
        for proc in nodes:
            daemons.stop(proc)
        daemons.stop(ctrl)
        lines = [json_line(tmp / f"node{i}.out") for i in range(n)]
        # the sending window, from the nodes' own clocks: first update sent -> last update applied
        starts = [x["synthetic_started_at"] for x in lines if "synthetic_started_at" in x]
        ends = [x["last_applied_at"] for x in lines if "last_applied_at" in x]
        delivered_min = min((int(x.get("updates_applied", 0)) for x in lines), default=0)
        rate, cores = 0.0, 0.0
        if starts and ends and max(ends) > min(starts):
            t0, t1 = min(starts), max(ends)
            rate = (delivered_min / max(1, n - 1)) / (t1 - t0)
            inside = [c for c in cpu_samples if t0 - 0.5 <= c[0] <= t1 + 0.5]
            if len(inside) >= 2:
                cores = (inside[-1][1] - inside[0][1]) / max(1e-9, inside[-1][0] - inside[0][0])
        ctrl_line = json_line(tmp / "controller.out")
        lost = int(ctrl_line.get("offline", 0)) + sum(int(x.get("controller_lost", 0)) for x in lines)
        gaps = [x.get("beat_gap_max_ms", 0.0) for x in lines]
        joined = [t for i in range(n) for t in log_times(tmp / f"node{i}.log", "joined the controller")]
        caught = [max(log_times(tmp / f"node{i}.log", "caught up"), default=None) for i in range(n)]
        catch_up = (max(caught) - min(joined)) if joined and all(c is not None for c in caught) else None
        diff = None
        master_path = tmp / "controller.npy"
        if master_path.exists() and all((tmp / f"node{i}.npy").exists() for i in range(n)):
            master = np.load(master_path)
            diff = max(float(np.max(np.abs(np.load(tmp / f"node{i}.npy") - master))) for i in range(n))
        return Run(mode, n, catch_up, rate, done_at is not None, cores, max(gaps, default=0.0) / 1000.0,
                   lost, diff, int(ctrl_line.get("updates_applied", 0)), expected)
    finally:
        daemons.close()
        if args.keep:
            say(f"  logs and dumps kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)  # (N + 1) dumps of the model


def generator_rates(params: int, sparsity: float, seconds: float) -> tuple[float, float]:
    """Updates/s of the direct sparse generator and of the old dense path, same size and sparsity."""
    from psrv.server.cli.synthetic import SyntheticUpdates

    rates = []
    for direct in (True, False):
        gen = SyntheticUpdates(params, sparsity=sparsity, seed=1, direct=direct)
        gen.next_message()
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds or count < 3:
            gen.next_message()
            count += 1
        rates.append(count / (time.perf_counter() - start))
    return rates[0], rates[1]


def main(argv: list[str] | None = None) -> int:
    cores = os.cpu_count() or 1
    default_nodes = ",".join(str(n) for n in (4, 8, 14) if n + 2 <= cores) or "2"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--nodes", default=default_nodes,
                   help="comma-separated node counts; the default is those of 4,8,14 with N + 2 <= cores")
    p.add_argument("--params", type=int, default=11_000_000, help="parameters of the model (float32)")
    p.add_argument("--modes", default="plain,mesh", help="mesh modes to run")
    p.add_argument("--fan-out", type=int, default=4, help="MESH fan-out")
    p.add_argument("--updates", type=int, default=200, help="updates each node sends")
    p.add_argument("--rate", type=float, default=0.0, help="updates/s per node (0 = max)")
    p.add_argument("--sparsity", type=float, default=0.001, help="fraction of P an update touches")
    p.add_argument("--heartbeat-ms", type=int, default=1000, help="heartbeat interval")
    p.add_argument("--missed-beats", type=int, default=3, help="beats a member may miss")
    p.add_argument("--deadline", type=float, default=240.0, help="seconds a run may take")
    p.add_argument("--generator-seconds", type=float, default=3.0, help="per generator figure (0 = skip)")
    p.add_argument("--insecure", action="store_true",
                   help="run without CurveZMQ (keys are on otherwise, as in the daemons)")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep each run's logs and dumps (else deleted)")
    args = p.parse_args(argv)
    counts = [int(x) for x in args.nodes.split(",") if x]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    say(f"bench_scale: {cores} cores, P={args.params}, nodes {counts}, modes {modes}, "
        f"{args.updates} updates/node at {args.rate or 'max'}/s, sparsity {args.sparsity}")
    results: list[Run] = []
    for n in counts:
        for mode in modes:
            say(f"run {mode} x{n}")
            results.append(one_run(mode, n, args))
            say(f"  -> {results[-1]}")
    plain_rate = {r.nodes: r.rate_per_worker for r in results if r.mode == "plain"}
    print(f"\n{cores} cores, P = {args.params:,} float32, {args.updates} updates/node at "
          f"{args.rate or 'max'}/s, sparsity {args.sparsity}, heartbeat {args.heartbeat_ms} ms x "
          f"{args.missed_beats}, curve {'off' if args.insecure else 'on'}\n")
    print("| mode | N | catch-up s | updates/s per worker, to every replica | vs PLAIN | controller cores "
          "| longest beat gap s | members lost | applied / expected | replicas max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        base = plain_rate.get(r.nodes)
        ratio = f"{r.rate_per_worker / base:.2f}" if base else "-"
        print(f"| {r.mode.upper()} | {r.nodes} | {'-' if r.catch_up_s is None else f'{r.catch_up_s:.2f}'} "
              f"| {r.rate_per_worker:.1f}{'' if r.delivered else ' (cut)'} | {ratio} "
              f"| {r.controller_cores:.2f} "
              f"| {r.beat_gap_max_s:.2f} | {r.lost} | {r.applied} / {r.expected} "
              f"| {'-' if r.replica_diff is None else f'{r.replica_diff:.1e}'} |")
    gen = None
    if args.generator_seconds > 0:
        say("generator rates")
        rates = [generator_rates(args.params, args.sparsity, args.generator_seconds) for _ in range(3)]
        direct = statistics.median(r[0] for r in rates)
        dense = statistics.median(r[1] for r in rates)
        gen = {"direct": direct, "dense": dense}
        print(f"\nsynthetic generator, P = {args.params:,}, sparsity {args.sparsity} (median of 3): "
              f"direct sparse {direct:.0f} updates/s, dense residual + encoder {dense:.1f} updates/s "
              f"(x{direct / dense:.0f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": [r.__dict__ for r in results], "generator": gen},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
