#!/usr/bin/env python3
"""Time to target across two network namespaces on a shaped link: psrv against torch DDP.

The comparison of ``bench_local.py`` (the same MLP, data, AdamW, train loop and stop rule) with each
worker on its own host: worker 0 in network namespace A, worker 1 in namespace B, each joined to the
root namespace by a veth pair shaped with a token bucket (``tc qdisc ... tbf``) at ``--rate`` both
ways. The root namespace holds the launcher: psrv's rendezvous and controller (the master copy), bound
on the bridge's address, which the workers reach over their shaped links; the workers pick their own
interface by the network mask. DDP runs gloo with rank 0 in A (its store listening there) and rank 1
in B, so its all-reduce crosses both shaped links.

Reported per way (medians of ``--repeats`` runs, the ways alternating): wall time to the target
accuracy, the clock starting when every worker is ready (process start-up, the model's build and the
join excluded), optimizer steps per worker, the worker's time per step (that wall time over the
steps), bytes sent per worker (psrv: the encoded updates; DDP: the ring all-reduce's 2(N-1)/N of the
gradient per step, computed), what each worker's link carried out of its host over the whole run
(tbf's byte counter: start-up, the join or DDP's broadcast, and the protocols' headers included) and
the ratio of DDP's time to psrv's. Markdown on stdout, progress on stderr. Needs root (``ip netns``,
``tc``); exits 2 when namespaces cannot be built. Namespaces, links and processes are removed
whatever happens.

    sudo .venv/bin/python scripts/bench_netns.py                       # 11 M parameters at 1 Gbit/s
    sudo .venv/bin/python scripts/bench_netns.py --size 1m --repeats 1 --target 0.5   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# the namespace helper lives beside the cluster tests that built it; the benchmark borrows it as is
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "cluster")]
# _WORKER, _watch and _reap below: the program psrv.run starts each worker with, how it waits for them
# and how it stops them; here the program runs behind `ip netns exec`

import bench_local  # noqa: E402
from bench_step_cost import SIZES  # noqa: E402
from netns import Hosts, unavailable_reason  # noqa: E402
from psrv.torch.launch import _WORKER, RunResult, raise_failure  # noqa: E402
from psrv.torch.launch import _reap as reap  # noqa: E402  (psrv.run's: terminate, then kill)
from psrv.torch.launch import _watch as watch  # noqa: E402  (psrv.run's: reports, silent deaths)
from psrv.torch.rendezvous import Rendezvous  # noqa: E402
from psrv.torch.worker import dump_call  # noqa: E402
from psrv.transport import TransportConfig  # noqa: E402

WORKER_HOSTS = ("a", "b")  # rank r runs in WORKER_HOSTS[r]
UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def rate_bits(rate: str) -> int:
    """``1gbit``, ``100mbit``... in bits per second; a clear error for anything else."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)", rate.strip().lower())
    if not match:
        raise ValueError(f"--rate: expected a tc rate such as 1gbit, 100mbit or 500kbit, got {rate!r}")
    return int(float(match[1]) * UNITS[match[2]])


def burst_for(rate: str) -> str:
    """A bucket that holds 4 ms at ``rate`` (at least 32 kbit): tbf's bucket must outlast a timer tick,
    or the link carries less than its rate."""
    return f"{max(32, rate_bits(rate) * 4 // 1000 // 1000)}kbit"


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a worker process: what this process imports, one thread each (2 workers)."""
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **extra}


def link_throughput(hosts: Hosts, hub_address: str, seconds: float = 1.0) -> float:
    """Bits per second one TCP stream carries from host A to the launcher: the shaping, checked."""
    with socket.create_server((hub_address, 0)) as server:
        server.settimeout(15)
        program = ("import socket, sys, time; "
                   "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 15); "
                   "end = time.monotonic() + float(sys.argv[3]); chunk = bytes(1 << 16)\n"
                   "while time.monotonic() < end: s.sendall(chunk)\ns.close()")
        proc = subprocess.Popen(hosts.argv(WORKER_HOSTS[0], [sys.executable, "-c", program, hub_address,
                                                             server.getsockname()[1], seconds]))
        try:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(15)
                received, start = 0, time.monotonic()
                while chunk := conn.recv(1 << 20):
                    received += len(chunk)
                elapsed = time.monotonic() - start
            proc.wait(15)
        finally:
            reap([proc])
    return received * 8 / elapsed


def sent_on_links(hosts: Hosts) -> int:
    """Bytes the hosts have sent on their links so far (tbf's counters on their eth0)."""
    total = 0
    for host in WORKER_HOSTS:
        stats = hosts.run(host, ["tc", "-s", "qdisc", "show", "dev", "eth0"]).stdout
        match = re.search(r"Sent (\d+) bytes", stats)
        if match is None:
            raise RuntimeError(f"no byte counter in tc's statistics of {host}'s link: {stats!r}")
        total += int(match[1])
    return total


def run_psrv(hosts: Hosts, hub_address: str, args: argparse.Namespace, hidden: tuple[int, ...]) -> dict:
    """``psrv.run``'s job with each worker started inside its namespace (``ip netns exec``)."""
    hub = Rendezvous(len(WORKER_HOSTS), TransportConfig(network_mask=hosts.mask), host=hub_address)
    procs: list[subprocess.Popen] = []
    try:
        with tempfile.TemporaryDirectory(prefix="psrv-netns-") as tmp:
            payload = dump_call(bench_local.psrv_worker,
                                (args.target, args.batch, args.max_steps, args.every,
                                 os.path.join(tmp, "stop")), {"hidden": hidden})
            path = os.path.join(tmp, "payload.pkl")
            Path(path).write_bytes(payload)
            for rank, host in enumerate(WORKER_HOSTS):
                env = python_env(**hub.environment(rank, job="netns").variables())
                procs.append(subprocess.Popen(hosts.argv(host, [sys.executable, "-c", _WORKER, path]),
                                              env=env))
            if not watch(hub, procs, args.timeout):
                raise TimeoutError(f"psrv: no result within --timeout {args.timeout:.0f} s")
        if hub.failure is not None:
            raise_failure(hub.failure)
        result = RunResult.from_hub(hub, len(WORKER_HOSTS))
    finally:
        reap(procs)
        hub.close()
    return {"steps": result.value["steps"], "seconds": result.value["seconds"],
            "bytes": int(statistics.mean(r["bytes_sent"] for r in result.reports))}


def run_ddp(hosts: Hosts, args: argparse.Namespace, hidden: tuple[int, ...]) -> dict:
    """``bench_local.ddp_worker`` with rank r inside WORKER_HOSTS[r]; rank 0 holds gloo's store."""
    port = 20000 + secrets.randbelow(20000)  # the namespace is fresh: any port is free there
    program = ("import json, sys; from bench_local import ddp_worker; "
               "ddp_worker(**json.loads(sys.argv[1]))")
    procs: list[subprocess.Popen] = []
    try:
        with tempfile.TemporaryDirectory(prefix="psrv-netns-ddp-") as tmp:
            out = os.path.join(tmp, "ddp.txt")
            for rank, host in enumerate(WORKER_HOSTS):
                call = {"rank": rank, "size": len(WORKER_HOSTS), "port": port, "target": args.target,
                        "batch": args.batch, "max_steps": args.max_steps, "every": args.every,
                        "out": out, "hidden": list(hidden), "host": hosts.address(WORKER_HOSTS[0])}
                # gloo's own connections on the host's link, not on whatever the host name resolves to
                env = python_env(GLOO_SOCKET_IFNAME="eth0")
                procs.append(subprocess.Popen(
                    hosts.argv(host, [sys.executable, "-c", program, json.dumps(call)]), env=env))
            deadline = time.monotonic() + args.timeout
            for rank, proc in enumerate(procs):
                try:
                    code = proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired as exc:
                    raise TimeoutError(f"DDP: no result within --timeout {args.timeout:.0f} s") from exc
                if code != 0:
                    raise RuntimeError(f"DDP: rank {rank} exited with code {code}")
            steps, seconds, sent = Path(out).read_text().split()
    finally:
        reap(procs)
    return {"steps": int(steps), "seconds": float(seconds), "bytes": int(sent)}


def print_table(runs: dict[str, list[dict]], args: argparse.Namespace, params: int, carried: float) -> None:
    print(f"MLP of {params:,} parameters ({args.size}), AdamW lr 1e-3, batch {args.batch} per worker, "
          f"target test accuracy {args.target}; 2 workers in two network namespaces, each link shaped "
          f"to {args.rate} both ways (tbf; one TCP stream measured {carried / 1e6:.0f} Mbit/s); "
          f"medians of {args.repeats} runs\n")
    print("| way | seconds to target | steps per worker | ms per step | MB sent per worker | "
          "MB on the link per worker |")
    print("|---|---|---|---|---|---|")
    medians: dict[str, float] = {}
    for name, results in runs.items():
        seconds = medians[name] = statistics.median(r["seconds"] for r in results)
        steps = statistics.median(r["steps"] for r in results)
        missed = sum(r["steps"] >= args.max_steps for r in results)
        note = f" ({missed} of {len(results)} stopped at --max-steps)" if missed else ""
        step_ms = statistics.median(r["seconds"] / r["steps"] * 1e3 for r in results)
        print(f"| {name} | {seconds:.1f}{note} | {steps:.0f} | {step_ms:.0f} | "
              f"{statistics.median(r['bytes'] for r in results) / 1e6:.1f} | "
              f"{statistics.median(r['wire'] for r in results) / 1e6:.1f} |")
    ddp, psrv_ = medians["torch DDP (gloo)"], medians["psrv"]
    print(f"\nDDP time / psrv time: **{ddp / psrv_:.2f}x**")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="11m",
                        help="the MLP: 1m (256-1024-768-10) or 11m (256-3072-3072-256-10); default 11m")
    parser.add_argument("--rate", default="1gbit", help="each worker's link, both ways (a tc rate)")
    parser.add_argument("--target", type=float, default=0.7, help="test accuracy both ways train to")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way (medians)")
    parser.add_argument("--max-steps", type=int, default=3000, help="steps per worker at most")
    parser.add_argument("--batch", type=int, default=64, help="examples per step per worker")
    parser.add_argument("--every", type=int, default=25, help="steps between rank 0's accuracy checks")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take at most")
    args = parser.parse_args(argv)
    try:
        burst = burst_for(args.rate)
    except ValueError as exc:
        parser.error(str(exc))
    why = unavailable_reason()
    if why is not None:
        log(f"bench_netns: cannot build the two hosts as network namespaces: {why}. Run the script as "
            "root on Linux with iproute2 (`sudo .venv/bin/python scripts/bench_netns.py`)")
        return 2
    # SIGTERM / SIGHUP unwind like Ctrl-C, so the finally blocks remove namespaces and processes
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    hidden = tuple(SIZES[args.size])
    params = sum(p.numel() for p in bench_local.make_model(hidden).parameters())
    with Hosts(list(WORKER_HOSTS)) as hosts:
        # the root namespace joins the hosts' network on the bridge: the launcher's side of the links
        hub_address = f"198.18.{hosts.net}.1"
        subprocess.run(["ip", "addr", "add", f"{hub_address}/24", "dev", hosts.bridge], check=True,
                       capture_output=True, timeout=15)
        for host in WORKER_HOSTS:
            hosts.shape(host, args.rate, burst=burst)
        log(f"namespaces {[hosts.namespace(h) for h in WORKER_HOSTS]} on {hosts.mask}, launcher at "
            f"{hub_address}, links at {args.rate} (burst {burst}); {params:,} parameters")
        carried = link_throughput(hosts, hub_address)
        log(f"one TCP stream from {WORKER_HOSTS[0]} to the launcher carried {carried / 1e6:.0f} Mbit/s")
        ways = {"torch DDP (gloo)": lambda: run_ddp(hosts, args, hidden),
                "psrv": lambda: run_psrv(hosts, hub_address, args, hidden)}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ways}
        for repeat in range(args.repeats):  # alternating, so load changes hit both ways alike
            for name, way in ways.items():
                before = sent_on_links(hosts)
                runs[name].append(way())
                runs[name][-1]["wire"] = (sent_on_links(hosts) - before) // len(WORKER_HOSTS)
                log(f"  run {repeat + 1}/{args.repeats} {name}: {runs[name][-1]}")
    print_table(runs, args, params, carried)
    return 0


if __name__ == "__main__":
    sys.exit(main())
