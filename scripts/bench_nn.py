"""Training throughput (examples/s) of psrv.nn against PyTorch on the CPU, measured in one run.

The same MLP and the same small LeNet-style CNN are trained on the same synthetic MNIST-shaped data
(28x28 images, 10 classes) by
  * psrv.nn   Network.compute_update + apply_update (the step a psrv worker runs),
  * PyTorch   the plain loop zero_grad / forward / loss / backward / optimizer.step,
  * adapter   psrv.nn.TorchNetwork (the PyTorch model behind the psrv contract).
Each figure is the median of --repeats timed runs after a warm-up; ratios are against PyTorch.
Both frameworks run with the same number of threads (--threads, default 1: one worker per core).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from psrv.nn import Adam, Conv2D, Dense, MaxPool2D, Network, Output, TorchNetwork


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true",
                        help="fewer steps and repeats (a smoke run of a few seconds; noisier figures)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step (default 64)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per repeat (default 200 for the MLP, 30 for the CNN; "
                        "--quick: a quarter)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed repeats, median reported (default 5; --quick: 3)")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS threads for psrv.nn and torch.set_num_threads for PyTorch (default 1)")
    parser.add_argument("--models", default="mlp,cnn",
                        help="comma-separated subset of mlp,cnn (default both)")
    return parser.parse_args(argv)


def _psrv_model(kind: str):
    if kind == "mlp":
        layers = [Dense(256), Dense(128), Output(10)]
        return Network(layers, input_shape=(784,), updater=Adam(1e-3), seed=0)
    layers = [Conv2D(8, 5, padding="same"), MaxPool2D(2), Conv2D(16, 5, padding="same"), MaxPool2D(2),
              Dense(64), Output(10)]
    return Network(layers, input_shape=(1, 28, 28), updater=Adam(1e-3), seed=0)


def _torch_module(kind: str):
    import torch

    torch.manual_seed(0)
    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)
        )
    return nn.Sequential(
        nn.Conv2d(1, 8, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def _data(kind: str, batch: int, batches: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    shape = (batch, 784) if kind == "mlp" else (batch, 1, 28, 28)
    xs = [rng.random(shape, dtype=np.float32) for _ in range(batches)]
    ys = [rng.integers(0, 10, batch) for _ in range(batches)]
    return xs, ys


def _time(step: Callable[[int], None], steps: int, repeats: int, batch: int) -> float:
    for i in range(max(3, steps // 10)):  # warm-up
        step(i)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            step(i)
        rates.append(steps * batch / (time.perf_counter() - start))
    return statistics.median(rates)


def bench(kind: str, batch: int, steps: int, repeats: int) -> dict[str, float]:
    import torch

    xs, ys = _data(kind, batch, 8)
    net = _psrv_model(kind)

    def psrv_step(i: int) -> None:
        update, _ = net.compute_update(xs[i % 8], ys[i % 8])
        net.apply_update(update)

    module = _torch_module(kind)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    txs = [torch.from_numpy(x) for x in xs]
    tys = [torch.from_numpy(y) for y in ys]

    def torch_step(i: int) -> None:
        optimizer.zero_grad()
        loss = loss_fn(module(txs[i % 8]), tys[i % 8])
        loss.backward()
        optimizer.step()

    adapter = TorchNetwork(_torch_module(kind), torch.nn.CrossEntropyLoss(),
                           input_shape=(784,) if kind == "mlp" else (1, 28, 28))

    def adapter_step(i: int) -> None:
        update, _ = adapter.compute_update(xs[i % 8], ys[i % 8])
        adapter.apply_update(update)

    # interleave the frameworks per repeat so that CPU contention hits all of them alike
    results: dict[str, list[float]] = {"psrv.nn": [], "PyTorch": [], "psrv TorchNetwork": []}
    steps_of = {"psrv.nn": psrv_step, "PyTorch": torch_step, "psrv TorchNetwork": adapter_step}
    for _ in range(repeats):
        for name, step in steps_of.items():
            results[name].append(_time(step, steps, 1, batch))
    return {name: statistics.median(rates) for name, rates in results.items()}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if args.quick else 5)
    print(f"# bench_nn: batch {args.batch_size}, threads {args.threads}, median of {repeats} repeats"
          f"{' (quick)' if args.quick else ''}; torch {torch.__version__}, numpy {np.__version__}")
    print("| model | framework | examples/s | vs PyTorch |")
    print("|---|---|---:|---:|")
    with threadpool_limits(args.threads, user_api="blas"):
        for kind in [m.strip() for m in args.models.split(",") if m.strip()]:
            if kind not in ("mlp", "cnn"):
                print(f"unknown model {kind!r}; expected mlp or cnn", file=sys.stderr)
                return 2
            steps = args.steps or (200 if kind == "mlp" else 30)
            if args.quick:
                steps = max(5, steps // 4)
            rates = bench(kind, args.batch_size, steps, repeats)
            base = rates["PyTorch"]
            label = "MLP 784-256-128-10" if kind == "mlp" else "CNN conv5x5(8)-pool-conv5x5(16)-pool-64-10"
            for name, rate in rates.items():
                print(f"| {label} | {name} | {rate:,.0f} | {rate / base:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
