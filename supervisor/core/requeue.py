"""Leaving a Slurm job before its time limit, and ending the job with the run.

A job's pre-timeout signal, or its end time drawing near, asks the daemon to leave
(RequeueRequested). A run still going is stopped as a shutdown stops it: the trainer saves,
the save is verified, then the job is requeued and the daemon exits REQUEUE
(transitions.shutdown_exit). The stop may not outlast the job: the trainer's SIGKILL and
the wait for verification both end at the request's `by`, so the job is requeued in time,
saved or not, and the journal says which (`slurm_save_late`). The next segment resumes from
the newest verified checkpoint, as after any restart.

A run that has finished, or is halted for the operator (crash loop, divergence, a GPU
fault, stopped by the operator), is not requeued: the daemon exits with its phase's code
and the job ends. With Rules.exit_when_ended the daemon does not even wait for the limit:
a run that finishes or halts while this daemon supervises it ends the job at once, and its
allocation goes back to the cluster.
"""

from __future__ import annotations

from dataclasses import replace

from trainwarden.supervisor.core.actions import Action, Exit, Record
from trainwarden.supervisor.core.events import (
    Event,
    RequeueRequested,
    Restored,
    ShutdownRequested,
)
from trainwarden.supervisor.core.exit_codes import exit_code_for
from trainwarden.supervisor.core.lifecycle import on_shutdown
from trainwarden.supervisor.core.phases import HALTED, Phase
from trainwarden.supervisor.core.state import Requeueing, Rules, State

ENDED = HALTED - {Phase.STOPPED}
"""Phases that end the job with exit_when_ended: finished, or halted by something other
than the operator (who stopped the trainer and may start it again)."""


def on_requeue(state: State, ev: RequeueRequested, rules: Rules, actions: list[Action]) -> State:
    seconds_left = round(max(ev.by - ev.t, 0.0), 3)
    if state.requeue is not None:
        return state  # the signal and the end time both asked: the first is in hand
    if state.shutdown or state.stop_reason == "operator" or state.phase in HALTED:
        # scancel's SIGTERM came first, the operator is stopping the run, or it has ended.
        reason = (
            "already shutting down"
            if state.shutdown
            else "the operator stopped the run"
            if state.stop_reason == "operator" or state.phase == Phase.STOPPED
            else state.halt_reason or str(state.phase)
        )
        actions.append(
            Record(
                {
                    "kind": "slurm_not_requeued",
                    "why": ev.why,
                    "phase": str(state.phase),
                    "reason": reason,
                },
            )
        )
        if state.shutdown:
            return state
        return on_shutdown(state, ShutdownRequested(ev.t, ev.why), rules, actions)
    actions.append(
        Record(
            {
                "kind": "slurm_requeue_requested",
                "why": ev.why,
                "seconds_left": seconds_left,
                "scontrol": ev.scontrol,
            },
        )
    )
    state = replace(state, requeue=Requeueing(by=ev.by, scontrol=ev.scontrol))
    state = on_shutdown(state, ShutdownRequested(ev.t, ev.why), rules, actions)
    if state.kill_at is not None and state.kill_at > ev.by:
        # stop_timeout_s is longer than the job has left: the SIGKILL comes at `by`.
        state = replace(
            state,
            kill_at=ev.by,
            requeue=replace(state.requeue, cut_short=True) if state.requeue else None,
        )
    return state


def ended_in_job(
    before: State, state: State, event: Event, rules: Rules, actions: list[Action]
) -> State:
    """With rules.exit_when_ended: the run has just finished or halted (`before` the event
    it had not) and no trainer runs: the daemon exits, and the job with it. Not a run found
    ended at the start (Restored): its owner submitted it again to look at it or start it."""
    if (
        not rules.exit_when_ended
        or state.shutdown
        or state.trainer_alive
        or state.phase == before.phase
        or state.phase not in ENDED
        or isinstance(event, Restored)
    ):
        return state
    code = exit_code_for(state.phase)
    actions.append(
        Record(
            {
                "kind": "slurm_run_ended",
                "phase": str(state.phase),
                "reason": state.halt_reason,
                "code": int(code),
            },
        )
    )
    actions.append(Exit(code))
    return replace(state, shutdown=True)
