"""``psrv run -n N script.py [args]``: run a training script on N local worker processes (torchrun's shape).

Each worker runs the script as ``__main__`` with its arguments; the script calls ``psrv.torch.init()`` and
wraps its optimizer in ``psrv.torch.DistributedOptimizer``. This process holds the controller: when every
worker has left it prints one JSON line (each rank's steps, messages and replica check; the controller's
count of updates applied per origin) and, with ``--save-master``, saves the master copy (``numpy.save``;
``RunResult.load_into`` order: ``model.parameters()``). A worker that raises stops the others; the
command then prints its traceback and exits 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

__all__ = ["add_parser", "run_command"]

log = logging.getLogger(__name__)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run", help="run a training script on N local workers sharing their steps (no Spark)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--num-workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--devices", default=None,
                        help="comma-separated device per worker (default: a GPU each where CUDA exists, "
                             "else the CPU)")
    parser.add_argument("--save-master", default=None, help="save the master copy here (numpy .npy)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    parser.set_defaults(func=run_command)


def run_command(ns: argparse.Namespace) -> int:
    from psrv.torch.launch import run  # lazy: imports torch, which `psrv --help` never needs
    from psrv.torch.worker import run_script  # lazy: as above

    if not os.path.isfile(ns.script):
        print(f"psrv run: no such script: {ns.script!r}", file=sys.stderr)
        return 2
    devices = ns.devices.split(",") if ns.devices else None
    try:
        result = run(run_script, os.path.abspath(ns.script), list(ns.args), num_workers=ns.num_workers,
                     devices=devices)
    except Exception as exc:  # the worker's own exception: its traceback was printed by the worker
        print(f"psrv run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if ns.save_master and result.params is not None:
        import numpy as np

        np.save(ns.save_master, result.params)
    summary = {
        "workers": [{key: report.get(key) for key in ("rank", "node_id", "node_ids", "steps", "messages",
                                                      "bytes_sent", "acknowledged", "momentum")}
                    | {"replica": (report.get("replica") or {}).get("status")} for report in result.reports],
        "applied_by_origin": {str(k): v for k, v in result.counters.get("applied_by_origin", {}).items()},
        "updates_applied": result.counters.get("updates_applied"),
    }
    print(json.dumps(summary))
    return 0
