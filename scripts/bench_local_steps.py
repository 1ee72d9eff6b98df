#!/usr/bin/env python3
"""What several optimizer steps a message cost in compute: a worker's step of ``TorchNetwork`` with
``local_steps=K`` (the minibatch split into K pieces, K forward, backward and optimizer passes, as
``SharedTrainingMaster(local_steps=K)`` takes them) against ``local_steps=1`` on the same minibatch,
measured in the same run. The step is the one a Spark task takes: on the host ``compute_update_pair``
(the parameters after and before, for the encoder's one-pass sum), on a GPU (``--device cuda``)
``compute_update_tensor`` (the step stays on the device for the device codec), timed to the device's
end of it. MLPs of about 130 k, 400 k, 1 M and 11 M parameters and the quality harness's small CNN
(``cnn``: 10 k parameters), Adam, one torch thread.

Prints, per model and K, the median milliseconds of a step over ``--repeats`` windows of ``--steps``
steps each (each window's median), the ratio to K = 1 (the compute a message costs) and the
milliseconds K steps add to one: what ``local_steps="auto"`` weighs (two steps up to 500,000
parameters). The bytes a message costs do not change with K (README: "Several optimizer steps a
message").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

FEATURES, CLASSES = 256, 10
#: 134,154, 399,370, 1,058,058 and 11,019,018 parameters
MLPS = {"mlp130k": (256, 256), "mlp400k": (512, 512), "mlp1m": (1024, 768), "mlp11m": (3072, 3072, 256)}


def _network(name: str, device: str = "cpu"):
    from psrv.nn import TorchNetwork

    torch.manual_seed(0)
    if name == "cnn":
        from quality import harness, tasks

        task = tasks.make("cnn", 0)
        module = harness.initial_module(task, harness.Setting())
        shape, features = task.input_shape, int(np.prod(task.input_shape))
    else:
        layers: list[torch.nn.Module] = []
        width = FEATURES
        for out in MLPS[name]:
            layers += [torch.nn.Linear(width, out), torch.nn.ReLU()]
            width = out
        module = torch.nn.Sequential(*layers, torch.nn.Linear(width, CLASSES))
        shape, features = (FEATURES,), FEATURES
    network = TorchNetwork(module, torch.nn.CrossEntropyLoss(), shape,
                           optimizer=lambda params: torch.optim.Adam(params, lr=1e-3), device=device)
    return network, shape, features


def measure(name: str, ks: list[int], batch: int, steps: int, repeats: int,
            device: str = "cpu", call: str = "compute_update_pair") -> tuple[dict[int, float], int]:
    """Median ms of a step at each K, the K interleaved window by window so that drift hits them alike;
    and the model's parameters."""
    network, shape, _ = _network(name, device)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, *shape)).astype(np.float32)
    y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, batch)]
    if device == "cpu":
        method = getattr(network, call)

        def step(k: int) -> None:
            method(x, y, local_steps=k)
    else:  # the device path's step, waited for: CUDA runs it after the call returns
        def step(k: int) -> None:
            network.compute_update_tensor(x, y, local_steps=k)
            torch.cuda.synchronize()
    windows: dict[int, list[float]] = {k: [] for k in ks}
    for k in ks:  # warm-up: the optimizer's state, torch's first calls
        step(k)
    for _ in range(repeats):
        for k in ks:
            times = []
            for _ in range(steps):
                started = time.perf_counter()
                step(k)
                times.append(time.perf_counter() - started)
            windows[k].append(statistics.median(times))
    return {k: 1000 * statistics.median(v) for k, v in windows.items()}, int(network.num_params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="cnn,mlp130k,mlp400k,mlp1m,mlp11m",
                        help="comma-separated: cnn, mlp130k, mlp400k, mlp1m, mlp11m (default: all)")
    parser.add_argument("--local-steps", default="1,2,4", help="comma-separated K (1 is always measured)")
    parser.add_argument("--batch", type=int, default=32, help="rows per worker minibatch (default 32)")
    parser.add_argument("--steps", type=int, default=10, help="steps per window (default 10)")
    parser.add_argument("--repeats", type=int, default=5, help="windows per K (default 5; medians)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default: the host's step) or a CUDA device, e.g. cuda (the device path)")
    parser.add_argument("--call", default="compute_update_pair",
                        choices=("compute_update_pair", "compute_update"),
                        help="on the CPU, the step measured: compute_update_pair (default: the Spark task's) "
                             "or compute_update (the network contract's, which returns a new array)")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not models or set(models) - {"cnn", *MLPS}:
        parser.error(f"--models: expected some of cnn, {', '.join(MLPS)}, got {args.models!r}")
    try:
        ks = sorted({1, *(int(k) for k in args.local_steps.split(",") if k)})
    except ValueError:
        parser.error(f"--local-steps: expected whole numbers, got {args.local_steps!r}")
    if ks[0] < 1 or args.batch < max(ks) or min(args.steps, args.repeats) < 1:
        parser.error("--local-steps must be >= 1 and at most --batch; --steps and --repeats >= 1")
    if args.device != "cpu" and not (args.device.startswith("cuda") and torch.cuda.is_available()):
        parser.error(f"--device: expected cpu or a CUDA device where CUDA is available, got {args.device!r} "
                     f"(torch.cuda.is_available() is {torch.cuda.is_available()})")
    torch.set_num_threads(1)
    call = args.call if args.device == "cpu" else "compute_update_tensor"
    print(f"# a worker's step ({call}) on {args.device}, Adam, batch {args.batch}, one torch thread; "
          f"medians of {args.repeats} windows of {args.steps} steps")
    print("| model | parameters | local steps | ms a step (a message) | vs one step a message | ms added |")
    print("|---|---|---|---|---|---|")
    for name in models:
        print(f"# {name} ...", file=sys.stderr, flush=True)
        times, parameters = measure(name, ks, args.batch, args.steps, args.repeats, args.device, args.call)
        for k in ks:
            print(f"| {name} | {parameters:,} | {k} | {times[k]:.2f} | {times[k] / times[1]:.2f}x | "
                  f"{times[k] - times[1]:+.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
