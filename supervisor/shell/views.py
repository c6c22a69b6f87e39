"""What the daemon shows: the state, checkpoint and status views of the protocol."""

from __future__ import annotations

import os
import time
from typing import cast

from trainwarden.supervisor import PROTOCOL_VERSION, __version__
from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core.policy import HALTED, Phase, Rules, State, next_to_delete
from trainwarden.supervisor.inputs.logfollow import LogFollower
from trainwarden.supervisor.inputs.slurm_job import JobLimit, Segment, SlurmJob
from trainwarden.supervisor.protocol import (
    CheckpointsView,
    LogStats,
    Quarantined,
    SlurmJobRecord,
    SlurmJobView,
    StateDetail,
    StateView,
    StatusFigures,
    StatusResult,
)
from trainwarden.supervisor.shell.config_watch import ConfigWatch
from trainwarden.supervisor.shell.hub import TelemetryHub
from trainwarden.supervisor.store import quarantine
from trainwarden.supervisor.store.checkpoints import CheckpointStore


def slurm_record(job: SlurmJob, limit: JobLimit | None, segment: Segment) -> SlurmJobRecord:
    """The Slurm job as the journal's `slurm_job` record holds it (`limit` None: scontrol
    not answered yet)."""
    if limit is None:
        note: str | None = "being read"
    elif limit.unlimited:
        note = "unlimited"
    elif limit.unknown is not None:
        note = f"unknown: {limit.unknown}"
    else:
        note = None
    return {
        "job_id": job.job_id,
        "name": job.name,
        "node": job.node,
        "partition": job.partition,
        "restart_count": job.restart_count,
        "time_limit_s": limit.time_limit_s if limit is not None else None,
        "end_time": limit.end_time if limit is not None else None,
        "limit_note": note,
        "segment": segment.number,
        "gap_s": segment.gap_s,
        "lost_s": segment.lost_s,
    }


def slurm_view(
    job: SlurmJob | None, limit: JobLimit | None, segment: Segment, wall: float
) -> SlurmJobView | None:
    """The `slurm` field of the state view: the record, and the time left from `wall`
    (time.time())."""
    if job is None:
        return None
    record = slurm_record(job, limit, segment)
    end = record["end_time"]
    return {**record, "ends_in_s": round(max(end - wall, 0.0), 3) if end is not None else None}


def state_view(
    s: State,
    now: float,
    config: ConfigWatch | None = None,
    slurm: SlurmJobView | None = None,
) -> StateView:
    """The `state` topic; `now` is time.monotonic(); `config`: the config file as the
    daemon read it (one stat per view); `slurm`: the job the daemon runs in."""
    detail: StateDetail = {}
    if s.phase == Phase.BACKOFF and s.backoff_until is not None:
        detail["restart_in_s"] = round(max(0.0, s.backoff_until - now), 3)
    if s.halt_reason and s.phase in HALTED:
        detail["reason"] = s.halt_reason
    if s.stop_reason:
        detail["stop_reason"] = s.stop_reason
    if s.pivot is not None:
        detail["pivot_stage"] = s.pivot.stage
        detail["pivot_step"] = s.pivot.step
    uptime = None
    if s.trainer_started_t is not None and s.trainer_alive:
        uptime = round(now - s.trainer_started_t, 3)
    notice = config.notice() if config is not None else None
    return {
        "state": s.phase,
        "detail": detail,
        "trainer_pid": s.trainer_pid,
        "trainer_uptime_s": uptime,
        "restarts": s.restarts,
        "restarts_by_cause": dict(s.restarts_by_cause),
        "restarts_without_progress": s.restarts_without_progress,
        "seg": s.seg,
        "spikes": {
            "rollbacks": len(s.spikes.rollbacks),
            "spike_steps": list(s.spikes.rollbacks),
            "lr_scale": s.spikes.lr_scale,
            "watching": s.spikes.watch[0] if s.spikes.watch else None,
        },
        "skips": [list(w) for w in s.spikes.windows],
        "config_changed": notice is not None,
        "config_notice": notice,
        "slurm": slurm,
    }


def checkpoints_view(s: State, rules: Rules, store: CheckpointStore) -> CheckpointsView:
    """The `checkpoints` topic: the verified ones, oldest first, and the quarantined with
    their reasons."""
    doomed = next_to_delete(s, rules)
    # store.quarantine makes each entry with Quarantined's keys, as a plain dict (the store
    # does not import the protocol).
    quarantined = cast(
        list[Quarantined], quarantine.entries(store.quarantined(), store.quarantine_notes)
    )
    return {
        "checkpoints": [
            {
                "step": c.step,
                "name": c.name,
                "path": str(store.dir / c.name),
                "bytes": c.bytes,
                "mtime": c.mtime,
                "verified": True,
                "pinned": c.step in s.pinned,
                "next_to_delete": c.step == doomed,
            }
            for c in s.checkpoints
        ],
        "quarantined": quarantined,
    }


def status_view(
    cfg: Config,
    started_t: float,
    state: StateView,
    checkpoints: CheckpointsView,
    hub: TelemetryHub,
    handles: frozenset[str] | None = None,
) -> StatusResult:
    """The `status` command's answer: the run, the state view, which of SIGTERM and
    SIGUSR1 the trainer catches (`handles`, None: unknown), telemetry and checkpoints."""
    figures = status_figures(hub)
    return {
        "protocol": PROTOCOL_VERSION,
        "version": __version__,
        "run": cfg.run.name,
        "run_dir": str(cfg.run_dir),
        "daemon_pid": os.getpid(),
        "daemon_started_at": started_t,
        "total_steps": cfg.trainer.total_steps,
        **state,
        "handles": sorted(handles) if handles is not None else None,
        **figures,
        "step": hub.last_step,
        **checkpoints,
    }


def status_figures(hub: TelemetryHub) -> StatusFigures:
    """Status's figures: the telemetry frame, the newest GPU and host samples, the disk,
    the in-place snapshots, how the log is read and the held-out evaluations."""
    return {
        **hub.telemetry(),
        "gpu": hub.latest.get("gpu"),
        "gpu_status": hub.samplers.gpu_status(),
        "host": hub.latest.get("host"),
        "disk_low": hub.samplers.disk_low,
        "disk_full": hub.journal.space.full,
        "disk_full_files": sorted(hub.journal.space.full_files),
        "snapshot_failing": hub.snapshot_failing(),
        "log": log_stats(hub.follower) if hub.follower else None,
        "val": hub.validation.status(time.time()),
    }


def log_stats(follower: LogFollower) -> LogStats:
    """How the run log is being read: the follower's counts and where it is."""
    stats = follower.stats
    return {
        "lines": stats.lines,
        "skipped_long": stats.skipped_long,
        "undecodable": stats.undecodable,
        "truncations": stats.truncations,
        "rotations": stats.rotations,
        "offset": follower.offset,
    }
