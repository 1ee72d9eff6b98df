"""The quality harness: gradient sharing's N workers simulated in one process beside one process,
synchronous averaging and parameter averaging, on the same data order (scripts/bench_quality.py)."""

from __future__ import annotations

__all__: list[str] = []
