"""Loss spikes, detected: the loss above spike_factor x its EMA for spike_patience steps in
a row (PaLM's and OPT's spikes: finite, far above the trend, lasting).

One detector per trainer start. It begins from the EMA as of the step the start resumes
from (each verified checkpoint keeps the `Baseline` of its step), so steps replayed after a
rollback or a crash are counted once, in the timeline that survives. Steps above the
threshold do not feed the EMA: a spike must not raise the bar it is measured against. No
spike is detected in the first spike_warmup steps of a start (they feed the EMA only if
below the threshold, so a fresh start seeds it); fewer than spike_patience
steps above the threshold are an `Outlier`, noted and not acted on.

The skip windows a rollback adds (`skip_window`) are in the trainer's step numbers, read
through contract.data_step: step s consumes the data of s + the length of every window
whose from <= s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import PersistedSpikes, SpikeFacts

SkipWindow = tuple[int, int]
RECENT = 32
"""Baselines of the newest steps a detector keeps, for the checkpoint a commit names
(a trainer logs a few steps past a checkpoint before the daemon sees its commit)."""


@dataclass(frozen=True, slots=True)
class SpikeRules:
    """[divergence]'s spike settings and what the trainer supports."""

    enabled: bool = True
    factor: float = 2.0
    window: int = 200
    patience: int = 5
    warmup: int = 50
    grad_norm_factor: float | None = None
    rollback_steps: int = 100
    skip_extra: int = 200
    lr_scale: float = 1.0
    max_rollbacks: int = 3
    horizon: int = 5000
    skip_data: bool = False
    """The trainer declares `skip_data`: a rollback passes it the windows to skip."""
    scales_lr: bool = False
    """The trainer declares `lr_scale`."""

    @property
    def alpha(self) -> float:
        return 2.0 / (self.window + 1)


class Baseline(NamedTuple):
    """The EMAs as of one step: where a start resumed from that step's checkpoint begins.
    (Named tuples, this and Detector: one is built for every step line, at a tenth of a
    frozen dataclass's cost.)"""

    step: int
    ema: float
    n: int
    """Steps the EMA has seen."""
    grad_ema: float | None = None

    def to_json(self) -> list[Any]:
        return [self.step, self.ema, self.n, self.grad_ema]

    @classmethod
    def from_json(cls, data: Any) -> Baseline:
        step, ema, n, grad_ema = data
        return cls(int(step), float(ema), int(n), None if grad_ema is None else float(grad_ema))


class Detector(NamedTuple):
    """One start's detection state (not persisted: a restarted daemon restarts the trainer,
    whose detector begins again from its checkpoint's baseline)."""

    ema: float | None = None
    n: int = 0
    grad_ema: float | None = None
    seen: int = 0
    """Steps of this start so far (the warmup counts them)."""
    last_step: int | None = None
    first: int | None = None
    """The first step of the current run of steps above the threshold."""
    above: int = 0
    peak: float = 0.0
    ema_at_first: float = 0.0
    recent: tuple[Baseline, ...] = ()

    @classmethod
    def starting_from(cls, baseline: Baseline | None) -> Detector:
        if baseline is None:
            return cls()
        return cls(baseline.ema, baseline.n, baseline.grad_ema, last_step=baseline.step)

    def baseline_at(self, step: int) -> Baseline | None:
        """The EMAs as of `step`, if this start logged it recently."""
        return next((b for b in reversed(self.recent) if b.step == step), None)


@dataclass(frozen=True, slots=True)
class Spike:
    first: int
    step: int
    """The step that made it a spike (the patience-th in a row above the threshold)."""
    peak: float
    ema: float
    """The loss EMA when the first step crossed the threshold."""
    threshold: float

    def to_json(self) -> SpikeFacts:
        return {
            "first_step": self.first,
            "step": self.step,
            "peak": self.peak,
            "ema": round(self.ema, 6),
            "threshold": round(self.threshold, 6),
        }


@dataclass(frozen=True, slots=True)
class Outlier(Spike):
    """Fewer than spike_patience steps above the threshold, then one below it."""


Verdict = Spike | Outlier | None


def observe(
    det: Detector, step: int, loss: float, grad_norm: float | None, rules: SpikeRules
) -> tuple[Detector, Verdict]:
    """The detector after one step line, and what it found."""
    if det.last_step is not None and step <= det.last_step:
        return det, None  # a step this timeline has counted already
    seen = det.seen + 1
    if det.ema is None:
        seeded = det._replace(ema=loss, n=1, grad_ema=grad_norm, seen=seen, last_step=step)
        return _remember(seeded, step), None
    threshold = rules.factor * det.ema
    high = loss > threshold or _grad_high(det, grad_norm, rules)
    if high and seen <= rules.warmup:
        # Not counted, and not fed to the EMA either: a restart into bad data must not
        # raise the bar during its warmup.
        return det._replace(seen=seen, last_step=step), None
    if high:
        first = det.first if det.first is not None else step
        ema_at_first = det.ema_at_first if det.first is not None else det.ema
        peak = max(det.peak, loss) if det.first is not None else loss
        above = det.above + 1
        held = det._replace(
            seen=seen,
            last_step=step,
            first=first,
            above=above,
            peak=peak,
            ema_at_first=ema_at_first,
        )
        if above == rules.patience:
            return held, Spike(first, step, peak, ema_at_first, rules.factor * ema_at_first)
        return held, None  # building up, or a spike already reported
    verdict: Verdict = None
    if det.first is not None and det.above < rules.patience:
        last = det.last_step if det.last_step is not None else step
        threshold = rules.factor * det.ema_at_first
        verdict = Outlier(det.first, last, det.peak, det.ema_at_first, threshold)
    a = rules.alpha
    grad_ema = det.grad_ema
    if grad_norm is not None:
        grad_ema = grad_norm if grad_ema is None else grad_ema + a * (grad_norm - grad_ema)
    # Built directly, not through dataclasses.replace: this is every healthy step line.
    ema, n = det.ema + a * (loss - det.ema), det.n + 1
    recent = (*det.recent[-(RECENT - 1) :], Baseline(step, ema, n, grad_ema))
    return Detector(ema, n, grad_ema, seen, step, recent=recent), verdict


def _grad_high(det: Detector, grad_norm: float | None, rules: SpikeRules) -> bool:
    factor = rules.grad_norm_factor
    if factor is None or grad_norm is None or det.grad_ema is None:
        return False
    return grad_norm > factor * det.grad_ema


def _remember(det: Detector, step: int) -> Detector:
    assert det.ema is not None
    baseline = Baseline(step, det.ema, det.n, det.grad_ema)
    return det._replace(recent=(*det.recent[-(RECENT - 1) :], baseline))


def with_detector(log: SpikeLog, detector: Detector) -> SpikeLog:
    """replace(log, detector=detector) as a copy of the instance dict: it runs on every
    step line (see progress._stepped)."""
    new = object.__new__(SpikeLog)
    new.__dict__.update(log.__dict__)
    new.__dict__["detector"] = detector
    return new


# ----------------------------------------------------------------------------- the run's log


@dataclass(frozen=True)
class SpikeLog:
    """What the run's spikes have done so far; all but the detector is persisted, so every
    later start (after a crash, a manual start, a daemon restart) passes the same windows."""

    windows: tuple[SkipWindow, ...] = ()
    """Every window skipped so far, in the order added (the trainer gets all of them)."""
    lr_scale: float = 1.0
    """The product of lr_scale over the rollbacks (for a trainer that supports it)."""
    rollbacks: tuple[int, ...] = ()
    """The first step of each spike rolled back from."""
    watch: tuple[int, int] | None = None
    """(first step of the last spike rolled back from, the step by which it is cured if no
    spike came first)."""
    baselines: tuple[Baseline, ...] = ()
    """The EMAs as of each verified checkpoint's step, oldest first."""
    halting: str | None = None
    """Why the run halts in diverged once the trainer killed for a spike has exited."""
    passed: int = 0
    """How many of the windows the last trainer start was given (the rest are new)."""
    rolling_back: tuple[int, int] | None = None
    """(first step of the spike, step rolled back to) until the restart starts a trainer:
    what is committed after that step meanwhile belongs to the abandoned timeline."""
    timeline: tuple[int, int] | None = None
    """(the first trainer start given the newest windows, the earliest step they change):
    losses logged before that start at or past that step belong to an abandoned timeline."""
    detector: Detector = Detector()

    def to_json(self) -> PersistedSpikes:
        return {
            "windows": [list(w) for w in self.windows],
            "lr_scale": self.lr_scale,
            "rollbacks": list(self.rollbacks),
            "watch": list(self.watch) if self.watch else None,
            "baselines": [b.to_json() for b in self.baselines],
            "passed": self.passed,
            "rolling_back": list(self.rolling_back) if self.rolling_back else None,
            "timeline": list(self.timeline) if self.timeline else None,
        }

    @classmethod
    def from_json(cls, data: Any) -> SpikeLog:
        if not isinstance(data, dict):
            return cls()
        watch = data.get("watch")
        rolling = data.get("rolling_back")
        timeline = data.get("timeline")
        return cls(
            windows=tuple((int(a), int(b)) for a, b in data.get("windows", [])),
            lr_scale=float(data.get("lr_scale", 1.0)),
            rollbacks=tuple(int(s) for s in data.get("rollbacks", [])),
            watch=(int(watch[0]), int(watch[1])) if watch else None,
            baselines=tuple(Baseline.from_json(b) for b in data.get("baselines", [])),
            passed=int(data.get("passed", 0)),
            rolling_back=(int(rolling[0]), int(rolling[1])) if rolling else None,
            timeline=(int(timeline[0]), int(timeline[1])) if timeline else None,
        )

    def baseline(self, step: int | None) -> Baseline | None:
        """The EMAs a start resumed from `step` begins with: as of that step, else as of the
        newest step before it known (its checkpoint was committed while no daemon saw its
        step line); none before it: afresh, seeded by the start's first step."""
        if step is None:
            return None
        return next((b for b in reversed(self.baselines) if b.step <= step), None)

    def recent_rollbacks(self, first: int, rules: SpikeRules) -> list[int]:
        """Rollbacks within the horizon before a spike whose first step is `first`."""
        return [s for s in self.rollbacks if first - s < rules.horizon]


# ----------------------------------------------------------------------------- windows


def skip_window(
    windows: tuple[SkipWindow, ...], resume_step: int, last_step: int, extra: int, max_step: int
) -> SkipWindow:
    """The window a rollback to `resume_step` adds for a spike whose last step was
    `last_step`: the restarted trainer's first step consumes the data `extra` steps past
    the first data after the spike's, [resume_step + 1, last_step + 1 + extra).

    Every earlier window that starts in between lengthens it: those jumped over data in the
    abandoned timeline and jump again in the new one, so without them the new timeline
    could land on the spike's data.
    """
    start = resume_step + 1
    crossed = sum(b - a for a, b in windows if start < a <= last_step)
    return start, min(last_step + 1 + extra + crossed, max_step)
