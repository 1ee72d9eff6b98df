"""What runs inside a Spark task: setup, the training loops, the node, the replica check, results, the
per-executor network, device choice, prefetching, evaluation and inference. Never imports the driver."""

from __future__ import annotations

__all__: list[str] = []  # a namespace: import the modules themselves
