"""What a network's output means, read from its loss: the activation for predictions and how a prediction
is made from the activated output.

The loss says what the model was trained for, so it also says how to predict:

======================================  ==========  ==================  ===============================
loss                                    kind        activation          prediction
======================================  ==========  ==================  ===============================
CrossEntropyLoss, NLLLoss, ``mcxent``   multiclass  softmax (NLL: none)  argmax; probability = the output
BCEWithLogitsLoss                       binary      sigmoid             p >= 0.5; probability [1-p, p]
BCELoss, ``xent``                       binary      none (already p)    p >= 0.5; probability [1-p, p]
MSELoss, L1Loss, SmoothL1Loss,          regression  none                the raw output; no probability
HuberLoss, ``mse``
======================================  ==========  ==================  ===============================

A binary output of several columns is multi-label: each column is thresholded on its own. Combinations
that cannot be right (a softmax over one column: always 1.0) are refused by :func:`check_outputs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psrv.nn.errors import ConfigError

__all__ = ["KINDS", "OutputSemantics", "check_outputs", "for_loss", "for_loss_name", "for_torch_loss"]

KINDS = ("multiclass", "binary", "regression")

#: torch loss class name -> (kind, activation for predictions)
_TORCH_LOSSES: dict[str, tuple[str, str | None]] = {
    "CrossEntropyLoss": ("multiclass", "softmax"),
    "NLLLoss": ("multiclass", None),  # the module ends in log_softmax: argmax is the same
    "BCEWithLogitsLoss": ("binary", "sigmoid"),
    "BCELoss": ("binary", None),  # the module outputs probabilities already
    "MSELoss": ("regression", None),
    "L1Loss": ("regression", None),
    "SmoothL1Loss": ("regression", None),
    "HuberLoss": ("regression", None),
}

#: psrv.nn loss names (the output layer applies its own activation)
_NETWORK_LOSSES = {"mcxent": "multiclass", "xent": "binary", "mse": "regression"}


@dataclass(frozen=True)
class OutputSemantics:
    """``kind`` (multiclass, binary or regression), the ``activation`` applied to the module's raw output
    for predictions (softmax, sigmoid or None) and where that came from (``source``, for messages)."""

    kind: str
    activation: str | None
    source: str

    @property
    def has_probability(self) -> bool:
        return self.kind != "regression"


def for_torch_loss(loss: Any, *, kind: str | None = None, activation: Any = "auto") -> OutputSemantics:
    """The semantics of a torch loss; ``kind``/``activation`` given by the user win over the loss's.
    An unknown loss needs ``kind`` (its activation then defaults to the kind's usual one)."""
    name = type(loss).__name__
    known = _TORCH_LOSSES.get(name)
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"output kind: expected one of {KINDS}, got {kind!r}")
    if known is None and kind is None:
        raise ConfigError(
            f"loss {name}: psrv cannot tell from it what the output means; say it: outputKind / "
            f"output_kind one of {KINDS} (known losses: {sorted(_TORCH_LOSSES)})")
    chosen_kind = kind or known[0]  # type: ignore[index]
    if activation == "auto":
        if known is not None and known[0] == chosen_kind:
            chosen_activation = known[1]
        else:
            usual = {"multiclass": "softmax", "binary": "sigmoid", "regression": None}
            chosen_activation = usual[chosen_kind]
        source = f"the loss {name}"
    else:
        if activation not in (None, "softmax", "sigmoid"):
            raise ConfigError(f"output_activation: expected 'softmax', 'sigmoid' or None, got {activation!r}")
        chosen_activation, source = activation, f"output_activation={activation!r} with the loss {name}"
    return OutputSemantics(chosen_kind, chosen_activation, source)


def for_loss_name(name: str, activation: str | None = None) -> OutputSemantics:
    """The semantics of a psrv.nn network's output layer (loss ``mcxent``, ``xent`` or ``mse``); its
    activation is the layer's own, already applied by the network's ``output``."""
    kind = _NETWORK_LOSSES.get(str(name).lower())
    if kind is None:
        raise ConfigError(f"loss {name!r}: expected one of {sorted(_NETWORK_LOSSES)}")
    return OutputSemantics(kind, activation, f"the output layer's loss {name!r}")


def for_loss(loss: Any, **kwargs: Any) -> OutputSemantics:
    """A torch loss object, or a psrv.nn loss name."""
    return for_loss_name(loss, **kwargs) if isinstance(loss, str) else for_torch_loss(loss, **kwargs)


def check_outputs(semantics: OutputSemantics, num_outputs: int) -> None:
    """Refuse what cannot be right, with the fix: a softmax (or a multiclass argmax) over one column
    predicts the same class for every row."""
    if num_outputs == 1 and semantics.kind == "multiclass":
        raise ConfigError(
            f"{semantics.source} means classes by argmax over the output's columns, but the model has one "
            "output column: every row would get class 0 (probability 1.0). Fix: give the model one output "
            "per class (e.g. 2 for two classes), or for two classes with one output use BCEWithLogitsLoss "
            "(psrv.nn: sigmoid + 'xent'); for a value, a regression loss (MSELoss)")
    if num_outputs == 1 and semantics.activation == "softmax":
        raise ConfigError(
            f"{semantics.source}: a softmax over one output column is always 1.0. Fix: output_activation "
            "'sigmoid' (binary) or None (regression), or one output per class")
