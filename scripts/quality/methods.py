"""The methods bench_quality.py compares: their names on the command line and in the tables, the
local-steps and message-period variants, and the ``sync@K`` runs of synchronous averaging."""

from __future__ import annotations

import math

METHODS = ("one", "sync", "syncsqrt", "synclin", "avg", "dl4j", "quantile", "warmup", "exact", "flushend",
           "flush16", "flush8", "mask", "latency", "warmrun", "ownpoint", "dl4jown", "quantown", "quant3",
           "default", "onestep", "zerostart", "exactdefault", "gradients", "gradlin")
#: the default with K optimizer steps a message: methods "local2", "local4", "local8"
LOCAL_STEPS = (2, 4, 8)
METHODS += tuple(f"local{k}" for k in LOCAL_STEPS)
#: the default with one message every K rounds: methods "period3", "period4", "period6" (at 2 rounds the
#: wire budget leaves one element a message)
PERIODS = (3, 4, 6)
METHODS += tuple(f"period{k}" for k in PERIODS)
#: the fraction of the elements the default's quantile τ sends (``--sparsity`` runs the default at another)
DEFAULT_SPARSITY = 0.03
#: steps of the sparsity warm-up of the "warmup" method (from 10 % of the elements down to 0.9 %)
WARMUP = 50
LABELS = {"one": "one process", "sync": "sync averaging (DDP)",
          "syncsqrt": "sync averaging, lr x sqrt(workers)", "synclin": "sync averaging, lr x workers",
          "avg": "param averaging /5",
          "dl4j": "sharing, DL4J settings", "quantile": "sharing, quantile τ",
          "warmup": "sharing, quantile τ + warm-up", "exact": "sharing, no quantization",
          "flushend": "sharing, quantile τ + end flush", "flush16": "sharing, quantile τ + flush/16",
          "flush8": "sharing, quantile τ + flush/8", "mask": "sharing, quantile τ + masking",
          "latency": "sharing, quantile τ, sparsity 1/rounds",
          "warmrun": "sharing, quantile τ + warm-up over the run",
          "ownpoint": "sharing, DL4J τ, steps from own point, momentum as given",
          "dl4jown": "sharing, DL4J τ, own point, momentum ** workers",
          "quantown": "sharing, quantile τ, steps from own point",
          "quant3": "sharing, quantile τ at 3 %, steps from own point",
          "default": "sharing, default (quantile τ at 3 % within 1 % of the bytes, own point, "
                     "momentum ** workers, local steps auto)",
          "onestep": "sharing, default with 1 step a message (local_steps=1)",
          "zerostart": "sharing, default with RMSprop's square average from zero (torch's start)",
          "exactdefault": "sharing, default's momentum, square start and local steps, no quantization",
          "gradients": "compressed gradients (quantile τ at 3 %), one optimizer",
          "gradlin": "compressed gradients (quantile τ at 3 %), one optimizer, lr x workers",
          **{f"local{k}": f"sharing, default, {k} local steps a message" for k in LOCAL_STEPS},
          **{f"period{k}": f"sharing, default, a message every {k} rounds" for k in PERIODS}}
#: a method ``sync@K``: synchronous averaging at K times the optimizer's learning rate
SYNC_AT = "sync@"


def sync_factor(method: str) -> float | None:
    """K of a method ``sync@K`` (None for any other name); ValueError where K is not a positive number."""
    if not method.startswith(SYNC_AT):
        return None
    try:
        factor = float(method[len(SYNC_AT):])
    except ValueError:
        factor = math.nan
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"{method!r}: expected {SYNC_AT}K with K a positive number, e.g. {SYNC_AT}8")
    return factor


def label(method: str) -> str:
    """A method's name in the tables."""
    factor = sync_factor(method)
    return LABELS[method] if factor is None else f"sync averaging, lr x {factor:g}"

