"""psrv's own-loop launchers on one machine, run as a user would: ``psrv run -n 2 script.py`` on a
script with its own loop, and ``psrv.run`` with a worker that raises. Real processes, real sockets.

The script's checks are the central invariant (every replica equals the master copy once drained), the
exactly-once accounting (the master copy holds each worker's every message, once), learning (the loss of
the master copy falls well below where it started) and the returned state loading into a fresh model.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

torch = pytest.importorskip("torch")

import psrv  # noqa: E402
import psrv.torch as pt  # noqa: E402
from own_loop_checks import SCRIPT, check_own_loop_run  # noqa: E402


def _psrv_run_own_loop(tmp_path: Path, *script_args: str) -> tuple[dict, np.ndarray]:
    """``psrv run -n 2`` of the user's script, as a user runs it: (the launcher's summary, the master)."""
    master_file = tmp_path / "master.npy"
    done = subprocess.run(
        [sys.executable, "-m", "psrv.server.cli", "run", "-n", "2", "--save-master", str(master_file),
         str(SCRIPT), "--out", str(tmp_path), "--steps", "80", *script_args],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), np.load(master_file)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_psrv_run_trains_a_users_own_loop(tmp_path: Path) -> None:
    summary, master = _psrv_run_own_loop(tmp_path)
    assert len(summary["workers"]) == 2
    check_own_loop_run(tmp_path, summary["workers"], summary["applied_by_origin"], master)
    assert json.loads((tmp_path / "rank0.json").read_text())["beta1"] == 0.9  # as the user built it


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_scale_momentum_sets_each_workers_beta1_to_the_power_of_the_job_size(tmp_path: Path) -> None:
    summary, master = _psrv_run_own_loop(tmp_path, "--scale-momentum")
    check_own_loop_run(tmp_path, summary["workers"], summary["applied_by_origin"], master)
    for rank, worker in enumerate(summary["workers"]):
        ran = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert ran["beta1"] == pytest.approx(0.81, abs=1e-12)
        assert [tuple(m[:2]) for m in worker["momentum"]] == [("AdamW betas[0]", 0.9)], worker


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_scale_momentum_sets_each_workers_sgd_momentum_to_the_power_and_scales_its_lr(tmp_path: Path) -> None:
    """SGD with Nesterov momentum and a cosine schedule built before wrapping: each worker of the 2
    steps with momentum 0.9 ** 2 and lr 0.05 * (1 - 0.81) / (1 - 0.9), and the run keeps every invariant
    and learns as the script's own SGD loop in one process does."""
    summary, master = _psrv_run_own_loop(tmp_path, "--scale-momentum", "--sgd")
    check_own_loop_run(tmp_path, summary["workers"], summary["applied_by_origin"], master, sgd=True)
    for rank, worker in enumerate(summary["workers"]):
        ran = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert ran["momentum"] == pytest.approx(0.81, abs=1e-12) and ran["beta1"] is None
        assert ran["lr_start"] == pytest.approx(0.05 * 1.9, rel=1e-12)
        assert [tuple(m[:2]) for m in worker["momentum"]] == [("SGD momentum", 0.9), ("SGD lr", 0.05)], worker


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs CUDA (torch.cuda.is_available() is False here)")
def test_psrv_run_trains_a_users_own_loop_on_the_gpu(tmp_path: Path) -> None:
    """The same script with its model and data on ``psrv.torch.device()``: the launcher gives each worker a
    GPU (round robin, so two workers share one GPU on a one-GPU host) and the optimizer shares from there
    (residual and encoding on the device, only the message on the host)."""
    summary, master = _psrv_run_own_loop(tmp_path, "--on-device")
    devices = {json.loads((tmp_path / f"rank{r}.json").read_text())["device"] for r in range(2)}
    assert devices <= {f"cuda:{i}" for i in range(torch.cuda.device_count())} and devices, devices
    check_own_loop_run(tmp_path, summary["workers"], summary["applied_by_origin"], master)


def _raises_on_rank_1(message: str) -> str:
    import psrv.torch as pt
    import torch

    pt.init()
    model = torch.nn.Linear(4, 2)
    optimizer = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    if pt.rank() == 1:
        raise ValueError(f"{message} (raised at {time.time():.3f})")
    deadline = time.monotonic() + 240  # rank 0 would train on: the launcher must stop it
    while time.monotonic() < deadline:
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
        time.sleep(0.01)
    return "rank 0 was never stopped"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_that_raises_comes_back_as_the_users_exception() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    with pytest.raises(ValueError, match="bad shard 7") as info:
        psrv.run(_raises_on_rank_1, "bad shard 7", num_workers=2)
    assert time.monotonic() - started < 120  # process start-up included
    raised_at = float(str(info.value).rpartition("raised at ")[2].rstrip(")"))
    assert time.time() - raised_at < 20  # from the worker's raise to the launcher's: seconds
    assert "rank 1 failed" in str(info.value.__cause__) and "_raises_on_rank_1" in str(info.value.__cause__)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, left


def test_run_refuses_bad_arguments_before_starting_anything() -> None:
    with pytest.raises(pt.SharingConfigError, match="num_workers"):
        psrv.run(_raises_on_rank_1, "x", num_workers=0)
    with pytest.raises(pt.SharingConfigError, match="train_fn"):
        psrv.run("not a function", num_workers=2)
