"""What of the policy's state survives a daemon restart: `persisted` is written to the
journal as each `state` record (whenever it changes), and `restore` makes the next daemon's
State from the newest one. What is not here (the trainer's pid, waiters, timers, the
checkpoints, which the start-up scan finds again) starts afresh."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainwarden.supervisor.core.phases import HALTED, Phase
from trainwarden.supervisor.core.spikes import SpikeLog
from trainwarden.supervisor.core.state import (
    RESTART_CAUSES,
    PivotPlan,
    RestartCause,
    Rules,
    State,
)

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import PersistedState


def persisted(state: State) -> PersistedState:
    """What survives a daemon restart (written to the journal as `state` records)."""
    return {
        "phase": str(state.phase),
        "seg": state.seg,
        "restarts": state.restarts,
        "restarts_by_cause": dict(state.restarts_by_cause),
        "restarts_without_progress": state.restarts_without_progress,
        "next_backoff_s": state.next_backoff_s,
        "failures": [list(pair) for pair in state.failures],
        "suspects": [list(pair) for pair in state.suspects],
        "fallbacks": state.fallbacks,
        "max_commit_gap": state.max_commit_gap,
        "divergences": state.divergences,
        "divergence_step": state.divergence_step,
        "halt_reason": state.halt_reason,
        "last_pivot_step": state.last_pivot_step,
        "memory_faults": state.memory_faults,
        "verified_high": state.verified_high,
        "resumes_after": state.resumes_after,
        "pinned": sorted(state.pinned),
        "digests": {c.name: c.digest for c in state.checkpoints if c.digest},
        "pivot": state.pivot.to_json() if state.pivot else None,
        "spikes": state.spikes.to_json(),
        "gpu_fault": state.gpu_fault.reason if state.gpu_fault else None,
    }


def restore(data: dict[str, Any], rules: Rules) -> State:
    """A fresh State carrying the persisted fields of a previous daemon."""
    phase = data.get("phase", Phase.STARTING)
    halt_reason = data.get("halt_reason")
    resumes_after = data.get("resumes_after") if phase not in HALTED - {Phase.STOPPED} else None
    if phase == Phase.STOPPED and resumes_after:
        # Stopped by a signal (a reboot, systemctl stop), not by the operator: go on.
        phase, halt_reason = Phase.STARTING, None
    if phase not in HALTED and data.get("gpu_fault"):
        # It died or was shut down handling a GPU fault: restarting the trainer would run
        # into the fault (and a signal's shutdown resumes nothing).
        phase, halt_reason, resumes_after = Phase.GPU_FAULT, data["gpu_fault"], None
    return State(
        # A daemon that died with a trainer up starts it again; a halted run stays halted.
        phase=Phase(phase) if phase in HALTED else Phase.STARTING,
        seg=int(data.get("seg", 0)),
        restarts=int(data.get("restarts", 0)),
        restarts_by_cause=_by_cause(data.get("restarts_by_cause")),
        restarts_without_progress=int(data.get("restarts_without_progress", 0)),
        next_backoff_s=data.get("next_backoff_s"),
        failures=tuple((int(a), int(b)) for a, b in data.get("failures", [])),
        suspects=tuple((int(a), int(b)) for a, b in data.get("suspects", [])),
        fallbacks=int(data.get("fallbacks", 0)),
        max_commit_gap=data.get("max_commit_gap"),
        divergences=int(data.get("divergences", 0)),
        divergence_step=data.get("divergence_step"),
        halt_reason=halt_reason,
        pinned=frozenset(int(s) for s in data.get("pinned", [])),
        digests=_digests(data.get("digests")),
        last_pivot_step=data.get("last_pivot_step"),
        pivot=PivotPlan.from_json(data["pivot"]) if data.get("pivot") else None,
        spikes=SpikeLog.from_json(data.get("spikes")),
        memory_faults=int(data.get("memory_faults", 0)),
        verified_high=_int_or_none(data.get("verified_high")),
        resumes_after=resumes_after if isinstance(resumes_after, str) else None,
    )


def _by_cause(data: Any) -> tuple[tuple[RestartCause, int], ...]:
    if not isinstance(data, dict):
        return ()
    return tuple(
        (c, data[c])
        for c in RESTART_CAUSES
        if isinstance(data.get(c), int) and not isinstance(data[c], bool) and data[c] > 0
    )


def _digests(data: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(data, dict):
        return ()
    return tuple(
        sorted((k, v) for k, v in data.items() if isinstance(k, str) and isinstance(v, str))
    )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
