"""Observing a fit: statistics, the HTML report, Chrome traces, metrics sinks, progress, worker logs."""
