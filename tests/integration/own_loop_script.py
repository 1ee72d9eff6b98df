"""A user's script with a training loop of its own, as `psrv run -n 2` and psrv.spark.run run it in the
tests: an MLP, AdamW (or SGD with Nesterov momentum) with a cosine schedule, gradient accumulation and
clipping, each rank on its shard.

It writes ``<out>/rank<r>.json`` (its losses and how many messages it sent) and, on rank 0, the model's
final ``state_dict`` (``<out>/rank0_state.pt``).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import psrv.torch as pt
import torch


def make_data(seed: int = 0, n: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 10)).astype(np.float32)
    y = (x @ rng.normal(size=(10, 3))).argmax(axis=1)
    return torch.from_numpy(x), torch.from_numpy(y)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))


def full_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


def make_optimizer(model: torch.nn.Module, sgd: bool = False) -> torch.optim.Optimizer:
    if sgd:
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4)


def train(out: str, steps: int = 80, accumulate: int = 2, batch: int = 32, on_device: bool = False,
          scale_momentum: bool = False, sgd: bool = False) -> float:
    pt.init()
    rank, size = pt.rank(), pt.size()
    x, y = make_data()
    model = make_model()
    if on_device:  # where the launcher placed this worker (a GPU each where CUDA exists), data too
        model.to(pt.device())
        x, y = x.to(pt.device()), y.to(pt.device())
    shard_x, shard_y = x[rank::size], y[rank::size]
    optimizer = make_optimizer(model, sgd)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    optimizer = pt.DistributedOptimizer(optimizer, model, scale_momentum=scale_momentum)
    lr_start = float(optimizer.param_groups[0]["lr"])  # as the job's size set it, with scale_momentum
    first = full_loss(model, x, y)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        optimizer.zero_grad()
        for _ in range(accumulate):
            idx = torch.randint(0, len(shard_x), (batch,), generator=generator).to(shard_x.device)
            loss = torch.nn.functional.cross_entropy(model(shard_x[idx]), shard_y[idx]) / accumulate
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    final = full_loss(model, x, y)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"first": first, "final": final, "messages": optimizer.messages,
                   "steps": optimizer.iterations, "device": str(next(model.parameters()).device),
                   "beta1": optimizer.param_groups[0].get("betas", (None,))[0],
                   "momentum": optimizer.param_groups[0].get("momentum"),
                   "lr_start": lr_start}, f)
    if rank == 0:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, os.path.join(out, "rank0_state.pt"))
    return final


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--on-device", action="store_true", help="train on psrv.torch.device()")
    parser.add_argument("--scale-momentum", action="store_true",
                        help="the momentum ** workers (AdamW's beta1; SGD's momentum, its lr scaled with it)")
    parser.add_argument("--sgd", action="store_true", help="SGD with Nesterov momentum instead of AdamW")
    args = parser.parse_args()
    train(args.out, args.steps, on_device=args.on_device, scale_momentum=args.scale_momentum, sgd=args.sgd)
