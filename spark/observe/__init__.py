"""Observing a fit: statistics, the HTML report, Chrome traces, metrics sinks, progress, worker logs.

The names users call are importable from here; each module's docstring says more (the record
format in :mod:`psrv.spark.observe.stats`).
"""

from __future__ import annotations

from psrv.spark.observe.metrics import MetricsLogger, MLflowLogger, TensorBoardLogger, log_validation
from psrv.spark.observe.report import export_stats_html, render_stats_html
from psrv.spark.observe.stats import (
    StatsFormatError,
    event,
    metrics_sample,
    normalize_stats,
    validation_sample,
)
from psrv.spark.observe.trace import chrome_trace, export_chrome_trace
from psrv.spark.observe.worker_logs import DRIVER_LOGGER

__all__ = [
    "DRIVER_LOGGER",
    "MLflowLogger",
    "MetricsLogger",
    "StatsFormatError",
    "TensorBoardLogger",
    "chrome_trace",
    "event",
    "export_chrome_trace",
    "export_stats_html",
    "log_validation",
    "metrics_sample",
    "normalize_stats",
    "render_stats_html",
    "validation_sample",
]
