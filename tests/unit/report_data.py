"""Synthetic training stats shaped like a real gradient-sharing run (for the report tests)."""

from __future__ import annotations

import numpy as np
from psrv.spark.observe.stats import event, metrics_sample, validation_sample

T0 = 1_763_800_000.0


def run_stats(workers: int = 2, epochs: int = 3, steps: int = 25, seed: int = 0) -> list[dict]:
    """Workers with setup, catch-up, wait/fit/encode steps and a flush per epoch; the driver's export,
    training job and a validation sample per epoch; a noisy falling loss."""
    rng = np.random.default_rng(seed)
    records: list[dict] = []
    clock = T0
    params = 18_000
    for epoch in range(epochs):
        job_start = clock
        records.append(event("driver", "export", clock, clock + 0.05, partition=-1))
        clock += 0.05
        ends = []
        for w in range(workers):
            name = f"executor-{w}:{4100 + w}"
            common = {"partition": w, "epoch": epoch + 1, "attempt": 0}  # epochs count from 1
            t = clock + 0.01 * w
            records.append(event(name, "setup", t, t + 0.04, **common))
            t += 0.04
            records.append(event(name, "catch_up", t, t + 0.03, **common))
            t += 0.03
            for step in range(steps):
                iteration = epoch * steps + step + 1
                wait = float(rng.uniform(0.001, 0.004)) * (4 if step % 9 == 0 else 1)
                fit = float(rng.uniform(0.008, 0.012))
                records.append(event(name, "wait", t, t + wait, **common))
                t += wait
                loss = 2.3 * np.exp(-iteration / 30) + 0.1 + float(rng.normal(0, 0.08))
                records.append(event(name, "fit", t, t + fit, iteration=iteration, loss=max(loss, 0.01),
                                     examples=16, **common))
                t += fit
                elements = int(rng.integers(40, 400))
                records.append(event(name, "encode", t, t + 0.001, iteration=iteration, elements=elements,
                                     sparsity=elements / params, threshold=3e-2 * 0.97 ** iteration,
                                     bytes=16 + 4 * elements, **common))
                t += 0.001
            records.append(event(name, "flush", t, t + 0.02, **common))
            t += 0.02
            records.append(metrics_sample(name, t, iteration=(epoch + 1) * steps, epoch=epoch + 1,
                                          bytes_received=50_000 * (epoch + 1),
                                          updates_applied=steps * workers))
            ends.append(t)
        clock = max(ends) + 0.02
        records.append(event("driver", "training_job", job_start, clock, workers=workers,
                             steps=steps * workers))
        records.append(validation_sample(clock, (epoch + 1) * steps, epoch + 1, accuracy=0.7 + 0.08 * epoch,
                                         f1=0.68 + 0.085 * epoch))
        clock += 0.05
    return records
