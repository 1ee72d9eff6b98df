"""Threshold algorithms: small strategy objects that pick tau for each encoding step.

Each has ``threshold`` (the current tau), ``observe(count, n)`` (what the last step emitted),
``get_state()`` (a msgpack/JSON-able dict naming its class) and the classmethod ``average(states)``
(the driver averages the workers' states back into one algorithm). ``threshold_algorithm_from_state``
rebuilds any of them from its state. They hold no clock: a schedule advances once per observed step.
Each meets the ThresholdAlgorithm Protocol (psrv.encoding.strategies), which a user's own class may
meet as well.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
from psrv.encoding.errors import InvalidStateError
from psrv.encoding.strategies import ThresholdAlgorithm
from psrv.encoding.update_header import packed_message_bytes_bound

#: one step of the adaptive schedules; 20 steps halve (or double) tau, as in DL4J
DEFAULT_DECAY = 0.5 ** (1 / 20)
#: tau is kept inside these bounds so it always stays a normal, positive float32
MIN_THRESHOLD = 1e-30
MAX_THRESHOLD = 1e30
#: the least share of ``sparsity``'s elements a byte budget leaves a message: below about 700 parameters
#: 1 % of a dense update holds a handful of elements or none, and such messages would carry too little
BUDGET_FLOOR = 1 / 3


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def _check_observation(count: int, n: int) -> None:
    if count < 0 or n < 0 or count > n:
        raise ValueError(f"observe expects 0 <= count <= n, got count={count}, n={n}")


def _decay(value: float) -> float:
    decay = _positive("decay", value)
    if decay >= 1:
        raise ValueError(f"decay must be in (0, 1), got {value}")
    return decay


def _steered(threshold: float, decay: float, count: int, n: int, low: float, high: float) -> float:
    """tau after observing ``count`` of ``n``: lowered below sparsity ``low``, raised above ``high``."""
    _check_observation(count, n)
    if n == 0:
        return threshold
    sparsity = count / n
    if sparsity < low:
        return max(threshold * decay, MIN_THRESHOLD)
    if sparsity > high:
        return min(threshold / decay, MAX_THRESHOLD)
    return threshold


class _Base:
    """Shared state handling: the state is the class name plus the constructor's keyword arguments."""

    _fields: ClassVar[tuple[str, ...]] = ()
    threshold: float

    def _config(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}

    def get_state(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "threshold": float(self.threshold), **self._config()}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]):
        if state.get("type") != cls.__name__:
            raise InvalidStateError(f"state is for {state.get('type')!r}, not {cls.__name__}")
        try:
            algorithm = cls(**{name: state[name] for name in cls._fields})
            algorithm.threshold = _positive("threshold", state["threshold"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidStateError(f"cannot restore {cls.__name__} from {dict(state)!r}: {exc}") from None
        return algorithm

    @classmethod
    def average(cls, states: Iterable[Mapping[str, Any] | _Base]):
        """One algorithm whose tau is the mean of the given states' taus; their settings must agree."""
        algorithms = [s if isinstance(s, cls) else cls.from_state(s) for s in states]
        if not algorithms:
            raise InvalidStateError(f"cannot average zero {cls.__name__} states")
        first = algorithms[0]
        for other in algorithms[1:]:
            if other._config() != first._config():
                raise InvalidStateError(f"cannot average {cls.__name__} states with different settings: "
                                        f"{first._config()} vs {other._config()}")
        averaged = cls(**first._config())
        averaged.threshold = sum(a.threshold for a in algorithms) / len(algorithms)
        return averaged

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.get_state() == self.get_state()

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self._config().items())
        return f"{type(self).__name__}({settings}; threshold={self.threshold!r})"


class FixedThreshold(_Base):
    """tau never changes."""

    _fields = ("tau",)

    def __init__(self, tau: float = 1e-3) -> None:
        self.tau = _positive("tau", tau)
        self.threshold = self.tau

    def observe(self, count: int, n: int) -> None:
        _check_observation(count, n)


class AdaptiveThreshold(_Base):
    """Keep the sparsity (count / n) inside [min_sparsity, max_sparsity] (DL4J's adaptive algorithm).

    After a step below the range tau *= decay (more elements pass); above it tau /= decay.
    """

    _fields = ("initial", "min_sparsity", "max_sparsity", "decay")

    def __init__(self, initial: float = 1e-4, min_sparsity: float = 1e-4, max_sparsity: float = 1e-2,
                 decay: float = DEFAULT_DECAY) -> None:
        self.initial = _positive("initial", initial)
        self.min_sparsity = _positive("min_sparsity", min_sparsity)
        self.max_sparsity = _positive("max_sparsity", max_sparsity)
        if self.min_sparsity > self.max_sparsity or self.max_sparsity > 1:
            raise ValueError(
                f"need 0 < min_sparsity <= max_sparsity <= 1, got {min_sparsity}, {max_sparsity}")
        self.decay = _decay(decay)
        self.threshold = self.initial

    def observe(self, count: int, n: int) -> None:
        self.threshold = _steered(self.threshold, self.decay, count, n, self.min_sparsity, self.max_sparsity)


class TargetSparsityThreshold(_Base):
    """Steer the sparsity towards one target: below it tau *= decay, above it tau /= decay."""

    _fields = ("initial", "target", "decay")

    def __init__(self, initial: float = 1e-4, target: float = 1e-3, decay: float = DEFAULT_DECAY) -> None:
        self.initial = _positive("initial", initial)
        self.target = _positive("target", target)
        if self.target > 1:
            raise ValueError(f"target sparsity must be in (0, 1], got {target}")
        self.decay = _decay(decay)
        self.threshold = self.initial

    def observe(self, count: int, n: int) -> None:
        self.threshold = _steered(self.threshold, self.decay, count, n, self.target, self.target)


class SampledQuantileThreshold(_Base):
    """tau each step from the residual itself: the (1 - sparsity) quantile of |residual| over a strided
    sample of at most ``sample`` elements, so about ``sparsity`` of the elements are sent every step.

    An adaptive threshold reacts in tens of steps; an optimizer's first steps (Adam's are about lr on
    every element) pass any tau it starts from all at once, and the first messages are dense bitmaps.
    Taken from the residual before each encoding, tau fits the first step as well as the thousandth and
    no burst reaches the wire (the sampled threshold of Deep Gradient Compression, Lin et al. 2018).
    ``initial`` is only used when the encoder has not shown the algorithm a residual yet (a residual
    of zeros keeps the previous tau). The ResidualEncoder calls ``prepare(residual)`` before each
    encoding; ``observe`` only checks its arguments.

    ``warmup`` steps of sparsity warm-up (Deep Gradient Compression's): the first step sends
    ``warmup_sparsity`` of the elements and the fraction falls geometrically to ``sparsity`` over
    ``warmup`` steps, so less of the first steps' updates waits in the residual, at the price of
    bigger first messages. The step count is part of the state (a resumed fit goes on where it was).

    ``byte_budget`` (a fraction of a dense float32 update, 4 bytes an element; None: no budget): a
    message aims at no more elements than fit in that share of the dense bytes once packed
    (``psrv.encoding.update_header.packed_message_bytes_bound``). It binds on small models only, where a
    message's 16-byte header and its coding cost more per element: at 0.01 beside 3 % of the elements,
    below about 2,000 parameters (a model of 788 sends 9 elements where 3 % would be 24); above that 3 %
    fits inside it. It never cuts a message below ``BUDGET_FLOOR`` (a third) of ``sparsity``'s
    elements: below about 700 parameters, where the budget would leave fewer, it is exceeded rather
    than every message starved. The residual's size comes from ``sample_stride(n)`` or
    ``prepare``, which the encoder calls before every encoding (``prepare_sample`` called alone takes
    its sample's length for it).
    """

    _fields = ("sparsity", "sample", "initial", "warmup", "warmup_sparsity", "byte_budget")

    def __init__(self, sparsity: float = 9e-3, sample: int = 65536, initial: float = 1e-3,
                 warmup: int = 0, warmup_sparsity: float = 0.1, byte_budget: float | None = None) -> None:
        self.sparsity = _positive("sparsity", sparsity)
        if self.sparsity >= 1:
            raise ValueError(f"sparsity must be in (0, 1), got {sparsity}")
        if isinstance(sample, bool) or not isinstance(sample, int) or sample < 16:
            raise ValueError(f"sample must be an int >= 16, got {sample!r}")
        self.sample = sample
        self.initial = _positive("initial", initial)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0 (steps), got {warmup!r}")
        self.warmup = warmup
        self.warmup_sparsity = _positive("warmup_sparsity", warmup_sparsity)
        if self.warmup_sparsity >= 1:
            raise ValueError(f"warmup_sparsity must be in (0, 1), got {warmup_sparsity}")
        if warmup and self.warmup_sparsity < self.sparsity:  # without a warm-up it is never used
            raise ValueError(f"warmup_sparsity must be in [sparsity, 1) for a warm-up, got {warmup_sparsity} "
                             f"(sparsity {self.sparsity})")
        if byte_budget is not None:
            byte_budget = _positive("byte_budget", byte_budget)
            if byte_budget > 1:
                raise ValueError(f"byte_budget must be a fraction of a dense update's bytes in (0, 1], "
                                 f"got {byte_budget}")
        self.byte_budget = byte_budget
        self.threshold = self.initial
        self.steps = 0
        self._size: int | None = None  # the residual's, as the encoder last said
        self._budgeted: tuple[int, int] = (-1, 0)  # (n, budget_elements(n)), the last one asked

    @classmethod
    def for_steps(cls, steps: int, sparsity: float = 9e-3, **settings: Any) -> SampledQuantileThreshold:
        """Latency-aware sparsity: at ``sparsity`` an element's update waits about 1/sparsity steps in
        the residual, longer than a short run lasts, so most of the run's update never leaves it. For a
        run of ``steps`` encodings per worker this sends 1/steps of the elements per message instead,
        never less than ``sparsity`` nor more than 1/16 (where a message becomes a bitmap): long runs
        keep ``sparsity``, short ones pay more bytes and learn more per step."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an int >= 1 (encodings per worker in the run), got {steps!r}")
        chosen = min(1 / 16, max(float(sparsity), 1 / steps))
        return cls(chosen, warmup_sparsity=max(chosen, settings.pop("warmup_sparsity", 0.1)), **settings)

    def current_sparsity(self) -> float:
        """The fraction this step aims at: on the warm-up's geometric ramp, then ``sparsity``."""
        if self.steps >= self.warmup:
            return self.sparsity
        return self.warmup_sparsity * (self.sparsity / self.warmup_sparsity) ** (self.steps / self.warmup)

    def budget_elements(self, n: int) -> int | None:
        """The most elements a message of a residual of ``n`` elements aims at within ``byte_budget``
        (at least 1); None without a budget."""
        if self.byte_budget is None:
            return None
        if self._budgeted[0] == n:
            return self._budgeted[1]
        allowed = self.byte_budget * 4 * n
        low, high = 1, max(1, n)  # the bound grows with the count: the largest count within it
        while low < high:
            middle = (low + high + 1) // 2
            if packed_message_bytes_bound(middle, n) <= allowed:
                low = middle
            else:
                high = middle - 1
        self._budgeted = (n, low)
        return low

    def _budget_bounds(self, m: int, n: int, sparsity: float) -> tuple[int, int]:
        """For a sample of ``m`` of a residual of ``n`` elements: the elements within the byte budget,
        and the floor under it (a third of ``sparsity``'s), both counted in the sample."""
        return max(1, m * self.budget_elements(n) // n), math.ceil(m * sparsity * BUDGET_FLOOR)

    def message_rule(self, n: int) -> str:
        """What a message of a residual of ``n`` elements carries, in words: the driver logs it once per
        fit and keeps it in ``last_fit["threshold_rule"]``, so a user sees where the byte budget binds."""
        wanted = max(1, math.ceil(n * self.sparsity))
        head = f"tau at the {self.sparsity:.3g} quantile of each step's residual"
        if self.byte_budget is None:
            return f"{head}: about {wanted:,} of {n:,} elements a message"
        within, floor = self._budget_bounds(n, n, self.sparsity)
        budget = f"{self.byte_budget:.3g} of a dense update's {4 * n:,} bytes"
        if wanted <= within:
            return f"{head}: about {wanted:,} of {n:,} elements a message, within {budget}"
        if within >= floor:
            return (f"{head}, fewer to stay within {budget}: about {within:,} of {n:,} elements a message, "
                    f"where {self.sparsity:.3g} would be {wanted:,}")
        return (f"{head}: about {floor:,} of {n:,} elements a message, a third of {wanted:,}, the least the "
                f"byte budget may leave; a message may take up to "
                f"{packed_message_bytes_bound(floor, n):,} bytes, over {budget} "
                f"({self.byte_budget * 4 * n:,.0f} bytes)")

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "steps": self.steps}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]):
        if isinstance(state, Mapping):  # a state saved before the warm-up or the budget existed has none
            state = {"warmup": 0, "warmup_sparsity": 0.1, "byte_budget": None, **state}
        algorithm = super().from_state(state)
        steps = state.get("steps", 0)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise InvalidStateError(
                f"cannot restore {cls.__name__}: steps must be an int >= 0, got {steps!r}")
        algorithm.steps = steps
        return algorithm

    @classmethod
    def average(cls, states: Iterable[Mapping[str, Any] | _Base]):
        """The mean tau (as every algorithm) and the most steps any worker has taken."""
        states = list(states)
        averaged = super().average(states)
        averaged.steps = max(s.steps if isinstance(s, cls) else cls.from_state(s).steps for s in states)
        return averaged

    def sample_stride(self, n: int) -> int:
        """Every how many elements ``prepare`` samples a residual of ``n`` elements (and the size the
        byte budget is counted against for the sample that follows)."""
        self._size = n
        return max(1, -(-n // self.sample))

    def prepare(self, residual: Any) -> None:
        """Set tau from ``residual`` (a 1-D NumPy array or torch tensor, read only)."""
        n = int(residual.shape[0])
        if n == 0:
            return
        self.prepare_sample(residual[::self.sample_stride(n)])

    def prepare_sample(self, picked: Any) -> None:
        """``prepare`` from the sample alone: ``picked`` is the residual's every ``sample_stride(n)``-th
        element (``residual[::stride]``). An encoder whose residual is a sum it never writes out (the
        fused ``encode_difference``, the implicit residual's ``encode_gap``) computes just these
        elements, and saves the pass that would write the whole sum first."""
        if int(picked.shape[0]) == 0:
            return
        sparsity = self.current_sparsity()
        self.steps += 1
        rank = max(1, math.ceil(len(picked) * sparsity))  # the rank-th largest |r| of the sample
        if self.byte_budget is not None:
            size = self._size if self._size is not None and self._size >= len(picked) else len(picked)
            rank = min(rank, max(self._budget_bounds(len(picked), size, sparsity)))
        if isinstance(picked, np.ndarray):
            magnitudes = np.abs(picked)
            tau = float(np.partition(magnitudes, len(magnitudes) - rank)[len(magnitudes) - rank])
            reaching, above = np.count_nonzero(magnitudes >= tau), np.count_nonzero(magnitudes > tau)
        else:  # a torch tensor, on its device: only a few numbers cross to the host
            magnitudes = picked.abs()
            tau = float(magnitudes.kthvalue(len(magnitudes) - rank + 1).values)
            reaching, above = int((magnitudes >= tau).sum()), int((magnitudes > tau).sum())
        if reaching > 2 * rank and above > 0:
            # many elements tie at tau (equal steps, e.g. Adam's first): send only those above it; the
            # tied ones drift apart in later steps instead of all reaching the wire at once
            tau = float(np.nextafter(np.float32(tau), np.float32(np.inf)))
        if math.isfinite(tau) and tau > 0:
            self.threshold = min(max(tau, MIN_THRESHOLD), MAX_THRESHOLD)

    def observe(self, count: int, n: int) -> None:
        _check_observation(count, n)


#: the shared-training default's fraction of the elements a message and its budget of a dense
#: update's bytes (``shared_training_threshold``)
SHARED_TRAINING_SPARSITY = 0.03
SHARED_TRAINING_BYTE_BUDGET = 0.01


def shared_training_threshold(sparsity: float = SHARED_TRAINING_SPARSITY) -> SampledQuantileThreshold:
    """The threshold ``SharedTrainingMaster`` and ``TorchEstimator`` use unless given one: tau at the
    3 % quantile of each step's residual, within 1 % of a dense update's bytes (fewer elements on models
    below about 2,000 parameters; README's "How much a step learns")."""
    return SampledQuantileThreshold(sparsity=sparsity, byte_budget=SHARED_TRAINING_BYTE_BUDGET)


def describe_threshold(algorithm: Any, n: int) -> str:
    """A threshold algorithm's rule for a model of ``n`` parameters, in words, for the driver's log:
    its ``message_rule(n)`` where it has one (a user's own class may not), else its repr."""
    rule = getattr(algorithm, "message_rule", None)
    return str(rule(n)) if callable(rule) else repr(algorithm)


def dl4j_threshold() -> AdaptiveThreshold:
    """DL4J's threshold for shared training, by name: AdaptiveThreshold starting at tau = 1e-3, keeping
    the sparsity in [1e-4, 1e-2] (pair it with ResidualClipping(5, 5), DL4J's post-processor)."""
    return AdaptiveThreshold(1e-3)


ALGORITHMS: dict[str, type[_Base]] = {
    cls.__name__: cls
    for cls in (FixedThreshold, AdaptiveThreshold, TargetSparsityThreshold, SampledQuantileThreshold)
}


def threshold_algorithm_from_state(state: Mapping[str, Any]) -> _Base:
    """Rebuild a threshold algorithm from ``get_state()``; an unknown type is an InvalidStateError."""
    if not isinstance(state, Mapping):
        raise InvalidStateError(f"a threshold algorithm state is a dict, got {type(state).__name__}")
    cls = ALGORITHMS.get(state.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise InvalidStateError(
            f"unknown threshold algorithm {state.get('type')!r}; known: {sorted(ALGORITHMS)}")
    return cls.from_state(state)


__all__ = [
    "ALGORITHMS",
    "DEFAULT_DECAY",
    "MAX_THRESHOLD",
    "MIN_THRESHOLD",
    "AdaptiveThreshold",
    "FixedThreshold",
    "TargetSparsityThreshold",
    "SampledQuantileThreshold",
    "ThresholdAlgorithm",
    "threshold_algorithm_from_state",
]
