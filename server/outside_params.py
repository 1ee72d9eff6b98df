"""The facade's side of a machine built with ``params_outside=True``: it carries out the machine's
``Apply`` and ``Install`` actions through the hooks the role was given (a GPU's decode, a test's
stall), under the facade's lock, in the order the machine emitted them.

Every payload in an ``Apply`` passed the whole-message check at intake, so a hook that still raises
is not the message's fault (a device error, a bug in the hook): it is counted (``apply_errors``) and
logged, and the replica check at the end of training shows the difference it left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from psrv.transport.counters import Counters
from psrv.transport.events import Action, Apply, Install

__all__ = ["ApplyHook", "ApplyManyHook", "OutsideParams"]

#: ``apply(payload, header)``: adds one update where the live parameters are
ApplyHook = Callable[[np.ndarray, dict], None]
#: ``apply_many(payloads, headers) -> [None | the exception that failed that update]``
ApplyManyHook = Callable[[list[np.ndarray], list[dict]], list[Exception | None]]


class OutsideParams:
    """Carries out ``Apply``/``Install`` with ``apply(payload, header)``, the optional batch hook
    ``apply_many(payloads, headers) -> [None | error]`` and the optional ``installed(params)``."""

    def __init__(
        self,
        apply: ApplyHook,
        counters: Counters,
        log: logging.Logger,
        *,
        apply_many: ApplyManyHook | None = None,
        installed: Callable[[np.ndarray], None] | None = None,
    ) -> None:
        self.apply, self.apply_many, self.installed = apply, apply_many, installed
        self.counters, self.log = counters, log

    def carry_out(self, actions: list[Action]) -> list[Action]:
        """Carry out the parameters' actions; the others, in order, for the rest of the facade."""
        rest: list[Action] = []
        for action in actions:
            if isinstance(action, Apply):
                self._apply(action)
            elif isinstance(action, Install):
                if self.installed is not None:
                    self.installed(action.params)
            else:
                rest.append(action)
        return rest

    def _apply(self, action: Apply) -> None:
        if self.apply_many is not None and len(action.payloads) > 1:
            try:
                errors = self.apply_many(list(action.payloads), list(action.headers))
            except Exception as exc:  # the whole batch failed: report it once per update
                errors = [exc] * len(action.payloads)
            for header, error in zip(action.headers, errors, strict=True):
                if error is not None:
                    self._failed(header, error)
            return
        for payload, header in zip(action.payloads, action.headers, strict=True):
            try:
                self.apply(payload, header)
            except Exception as exc:
                self._failed(header, exc)

    def _failed(self, header: dict, error: BaseException) -> None:
        self.counters.add("apply_errors")
        self.log.error("update %s/%s passed its checks but the apply hook failed: %s: %s",
                       header.get("origin", "own"), header.get("seq", "-"), type(error).__name__, error)
