"""What runs on the Spark driver: masters, SparkNetwork, epochs, the live controller, preflight checks."""

from __future__ import annotations

__all__: list[str] = []  # a namespace: import the modules themselves
