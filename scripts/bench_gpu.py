#!/usr/bin/env python3
"""Benchmark gradient sharing on a GPU: the device codec and what sharing adds to a training step.

(1) psrv.encoding.device encode and decode throughput for 1 M, 11.7 M and 25.6 M floats at a sparsity
    of about 1e-3, beside a device-to-device copy of the same vector in the same run (ratio = codec
    bandwidth / copy bandwidth; target: encode >= 0.3x).
(2) a ResNet-18-sized model (torchvision's resnet18 when installed, else an equivalent defined here) on
    synthetic 32x32 images, batch 128: the training step alone, against psrv's default GPU worker step
    (the step taken from the replica plus the residual, residual + threshold + encode, copy of the
    message to the host through the reused pinned buffer, its own message applied, one peer's host
    message applied); the overhead in percent (target: <= 5 %) and each part timed on its own.
(3) decoding a frame of K received (host) updates into the device parameters: one by one against
    psrv.encoding.device.decode_many (one transfer and one kernel for the frame).
Medians of several runs; CUDA timings are synchronized. Without a GPU it prints "no GPU" and exits 0;
``--cpu`` runs the same measurements on CPU tensors (so the script itself is exercised; those figures
say nothing about a GPU). The tables are Markdown, ready for README.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from psrv.encoding import AdaptiveThreshold, ResidualEncoder, encode
from psrv.nn import TorchNetwork
from psrv.torch.device_sharing import DeviceSharing


def timer(device) -> Callable[[Callable[[], object], int], float]:
    import torch

    def median_seconds(run: Callable[[], object], repeats: int) -> float:
        times = []
        for i in range(repeats + 1):  # one untimed warm-up
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    return median_seconds


def threshold_for(vector, sparsity: float) -> float:
    """The |x| that lets about ``sparsity`` of the elements through."""
    k = max(1, int(round(sparsity * vector.numel())))
    return float(vector.abs().float().topk(k).values[-1])


def codec_table(device, sizes: list[int], repeats: int) -> list[str]:
    import torch
    from psrv.encoding import device as codec  # lazy: needs torch; without it the script says "no GPU"

    measure = timer(device)
    rows = ["| N (floats) | copy GB/s | encode ms | encode GB/s | encode / copy | decode ms | decode / copy "
            "| decode of a host message ms | message KB |", "|---|---|---|---|---|---|---|---|---|"]
    for n in sizes:
        generator = torch.Generator(device=device).manual_seed(n)
        source = torch.randn(n, generator=generator, device=device)
        tau = threshold_for(source, 1e-3)
        work = source.clone()
        copy_target = torch.empty_like(source)
        copy_s = measure(lambda work=work, copy_target=copy_target: copy_target.copy_(work), repeats)

        def encode_once(source=source, work=work, tau=tau) -> None:
            work.copy_(source)  # the same residual every run (the copy is subtracted below)
            codec.encode(work, tau)

        encode_s = max(measure(encode_once, repeats) - copy_s, 1e-9)
        message = codec.encode(source.clone(), tau)
        target = torch.zeros_like(source)
        decode_s = measure(lambda message=message, target=target: codec.decode(message, target), repeats)
        host_message = message.cpu().numpy()  # as the node's apply hook receives a peer's update
        host_s = measure(lambda m=host_message, target=target: codec.decode(m, target), repeats)
        gbs = 4 * n / 1e9
        rows.append(f"| {n:,} | {gbs / copy_s:.1f} | {encode_s * 1e3:.3f} | {gbs / encode_s:.1f} | "
                    f"{copy_s / encode_s:.2f}x | {decode_s * 1e3:.3f} | {copy_s / decode_s:.2f}x | "
                    f"{host_s * 1e3:.3f} | {message.numel() * 4 / 1e3:.1f} |")
    return rows


def batch_decode_table(device, n: int, batches: list[int], repeats: int) -> list[str]:
    """Decoding K received host messages into the device parameters: one by one vs decode_many."""
    import torch
    from psrv.encoding import device as codec  # lazy: needs torch; without it the script says "no GPU"

    measure = timer(device)
    rng = np.random.default_rng(n)
    rows = [f"| updates in the frame (N = {n:,}, sparsity 1e-3) | one by one ms | decode_many ms "
            "| speed-up |",
            "|---|---|---|---|"]
    for k in batches:
        messages = []
        for _ in range(k):
            x = np.zeros(n, dtype=np.float32)
            hits = rng.choice(n, max(1, n // 1000), replace=False)
            x[hits] = rng.choice([-1.0, 1.0], hits.size)
            messages.append(encode(x, 0.5))
        target = torch.zeros(n, device=device)

        def one_by_one(messages=messages, target=target) -> None:
            for message in messages:
                codec.decode(message, target)

        single = measure(one_by_one, repeats)
        batched = measure(lambda messages=messages, target=target: codec.decode_many(messages, target),
                          repeats)
        rows.append(f"| {k} | {single * 1e3:.3f} | {batched * 1e3:.3f} | {single / batched:.1f}x |")
    return rows


def resnet18_like(num_classes: int = 10):
    """torchvision's resnet18 if installed, else the same layout (11.2 M parameters at 10 classes)."""
    import torch
    from torch import nn

    try:
        import torchvision

        return torchvision.models.resnet18(num_classes=num_classes), "torchvision resnet18"
    except ImportError:
        pass

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers), "resnet18-like (defined in the script)"


def plain_step(device, batch: int):
    """A plain torch training step of the same model (no psrv): the minibatch copied in from the host
    (as psrv's step does), zero_grad, forward, backward, step."""
    import torch

    module = resnet18_like()[0].to(device)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, batch)

    def step() -> None:
        features, labels = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(module(features), labels).backward()
        optimizer.step()

    return step


def step_table(device, batch: int, repeats: int, warmup: int, profile: bool = False) -> list[str]:
    """The training step alone against the step of psrv's default GPU worker, and where the difference
    goes (each part timed on its own, synchronized, in a separate pass)."""
    import torch
    from psrv.encoding import device as codec  # lazy: needs torch; without it the script says "no GPU"
    from psrv.nn.torch_flat import load_with

    module, name = resnet18_like()
    network = TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(3, 32, 32),
                           optimizer=lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), device=device)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    encoder = ResidualEncoder(network.num_params, threshold_algorithm=AdaptiveThreshold(1e-3), device=device)
    sharing = DeviceSharing(network, encoder)
    peer = torch.randn(network.num_params, device=device)
    # a peer's update arrives as the node hands it to the apply hook: a host int32 array
    peer_message = codec.encode(peer, threshold_for(peer, 1e-3)).cpu().numpy()
    measure = timer(device)
    from_own_point = load_with(encoder.residual)  # step_from="own", the default: replica + residual

    def step_alone() -> None:
        update, _ = network.compute_update_tensor(x, y)
        network.apply_update(update)

    sizes: list[int] = []
    parts: dict[str, list[float]] = {}

    def step_and_share(timed: bool = False) -> None:
        marks = [time.perf_counter()]

        def mark(part: str) -> None:
            if timed:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                marks.append(time.perf_counter())
                parts.setdefault(part, []).append(marks[-1] - marks[-2])

        update, _ = network.compute_update_tensor(x, y, from_loaded=True, load=from_own_point)
        mark("step from replica + residual")
        message = encoder.encode_update(update)
        mark("residual += step, threshold, encode")
        if message is not None:
            host = sharing.to_host(message)  # what the node would send
            sizes.append(host.nbytes)
            mark("message to the host")
            codec.decode(host, network.flat_params, device_copy=message)  # as DeviceSharing.submit
            mark("own message applied")
        codec.decode(peer_message, network.flat_params)  # one peer's update arriving
        mark("one peer's message applied")

    for _ in range(warmup):  # the adaptive threshold settles (the first messages are dense)
        step_and_share()
    sizes.clear()
    plain = measure(plain_step(device, batch), repeats)
    alone = measure(step_alone, repeats)
    shared = measure(step_and_share, repeats)
    for _ in range(repeats):
        step_and_share(timed=True)
    overhead = (shared - alone) / alone * 100
    message_kb = statistics.median(sizes) / 1e3 if sizes else 0.0
    rows = [f"model: {name}, {network.num_params:,} parameters, batch {batch}, 32x32", "",
            "| plain torch step ms | step alone ms | step + share ms | overhead (vs step alone) "
            "| vs plain torch | message KB (median) |", "|---|---|---|---|---|---|",
            f"| {plain * 1e3:.2f} | {alone * 1e3:.2f} | {shared * 1e3:.2f} | {overhead:+.1f} % "
            f"| {(shared - plain) / plain * 100:+.1f} % | {message_kb:.1f} |", "",
            "| part of the sharing step (synchronized, alone) | ms (median) |", "|---|---|"]
    rows += [f"| {part} | {statistics.median(times) * 1e3:.3f} |" for part, times in parts.items()]
    if profile:
        rows += ["", *profile_rows(device, step_and_share, repeats)]
    return rows


def profile_rows(device, run: Callable[[], object], repeats: int) -> list[str]:
    """torch.profiler over ``repeats`` runs: the operators by their own CPU time and by device time
    (the tables' totals say how much host time the device time came with)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    averages = prof.key_averages()
    rows = [f"profile of {repeats} sharing steps, by own CPU time:", "```",
            averages.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60), "```"]
    if device.type == "cuda":
        rows += ["by device time:", "```",
                 averages.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=60),
                 "```"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU tensors (exercises the script only)")
    parser.add_argument("--sizes", default="1000000,11700000,25600000",
                        help="vector lengths, comma-separated")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--skip-model", action="store_true", help="only the codec table")
    parser.add_argument("--profile", action="store_true",
                        help="also profile the sharing step with torch.profiler (operator tables)")
    parser.add_argument("--warmup-steps", type=int, default=30,
                        help="untimed sharing steps first, while the adaptive threshold settles")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("no GPU (torch is not installed)")
        return 0
    if args.cpu:
        device = torch.device("cpu")
        label = "CPU tensors (--cpu): these figures are NOT GPU figures"
    elif torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        label = torch.cuda.get_device_name(device)
    else:
        print("no GPU (torch.cuda.is_available() is False); "
              "run with --cpu to exercise the script on CPU tensors")
        return 0
    print(f"device: {label}; torch {torch.__version__}\n")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    print("\n".join(codec_table(device, sizes, args.repeats)))
    print()
    first = sizes[0] if sizes else 1_000_000
    print("\n".join(batch_decode_table(device, first, [1, 4, 16, 64], args.repeats)))
    if not args.skip_model:
        print()
        print("\n".join(step_table(device, args.batch, max(3, args.repeats // 2), args.warmup_steps,
                                    args.profile)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
