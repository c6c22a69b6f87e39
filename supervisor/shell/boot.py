"""What a starting daemon reads and opens besides the loop: the policy's rules from the
config, the journal's last state, the paths it watches resolved through any link, the
optional metrics server."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.store import quarantine
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.journal import Journal, read_records
from trainwarden.supervisor.store.repeats import spawned_seg_of, state_of

if TYPE_CHECKING:
    from trainwarden.supervisor.core.records import MovedLinkFacts, ResolvedLinkFacts
    from trainwarden.supervisor.serve.metrics import MetricsServer

log = logging.getLogger("trainwarden.daemon")

LINK_CHECK_S = 2.0
"""How often the watched paths are resolved again, to report a link that changed target."""


VERIFY_MARGIN_S = 30.0
"""How much longer than a format's own verify_timeout_s a decision waits for a verdict."""
DEFAULT_VERIFY_WAIT_S = 180.0
"""How long a decision waits for a verification when the format sets no timeout."""


def verify_wait_s(cfg: Config) -> float:
    timeout = cfg.checkpoints.options.get("verify_timeout_s")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        return float(timeout) + VERIFY_MARGIN_S
    return DEFAULT_VERIFY_WAIT_S


def rules_from(cfg: Config) -> core.Rules:
    return core.Rules(
        verify_timeout_s=verify_wait_s(cfg),
        keep_last=cfg.checkpoints.keep_last,
        backoff_initial_s=cfg.restart.backoff_initial_s,
        backoff_max_s=cfg.restart.backoff_max_s,
        max_restarts_without_progress=cfg.restart.max_restarts_without_progress,
        stall_timeout_s=cfg.restart.stall_timeout_s,
        dump_timeout_s=cfg.restart.dump_timeout_s,
        stop_timeout_s=cfg.trainer.stop_timeout_s,
        save_wait_timeout_s=cfg.trainer.save_wait_timeout_s,
        max_loss=cfg.telemetry.max_loss,
        divergence_retries=cfg.restart.divergence_retries,
        suspect_window_steps=cfg.restart.suspect_window_steps,
        max_fallbacks=cfg.restart.max_fallbacks,
        max_step_jump=cfg.checkpoints.max_step_jump,
        total_steps=cfg.trainer.total_steps,
        mirror=cfg.mirror.path is not None,
        mirror_keep_last=cfg.mirror.keep_last,
        spikes=spike_rules(cfg),
        gpu_devices=None if cfg.gpu.devices is None else tuple(cfg.gpu.devices),
        gpu_reset=cfg.gpu.reset,
        gpu_idle_timeout_s=cfg.gpu.idle_timeout_s,
    )


def spike_rules(cfg: Config) -> core.SpikeRules:
    div = cfg.divergence
    return core.SpikeRules(
        enabled=div.spikes,
        factor=div.spike_factor,
        window=div.spike_window,
        patience=div.spike_patience,
        warmup=div.spike_warmup,
        grad_norm_factor=div.grad_norm_factor,
        rollback_steps=div.rollback_steps,
        skip_extra=div.skip_extra,
        lr_scale=div.lr_scale,
        max_rollbacks=div.max_rollbacks,
        horizon=div.rollback_horizon,
        skip_data="skip_data" in cfg.trainer.supports,
        scales_lr="lr_scale" in cfg.trainer.supports,
    )


class SlurmSegments(NamedTuple):
    """The Slurm job segments the journal holds (a `slurm_job` record each)."""

    n: int = 0
    lost_s: float = 0.0
    """Seconds between segments: from each previous daemon's last record to the next
    segment's start, added up."""
    last_t: float | None = None
    """When the journal's last record was written (the previous daemon's end)."""


class JournalTail(NamedTuple):
    """What a starting daemon takes from the journal before it decides anything."""

    state: dict[str, Any] | None
    """The newest persisted state."""
    clean: bool
    """Whether the previous daemon exited cleanly."""
    spawned_seg: int
    """The segment of the newest trainer start journaled (0: none). Lines the log gained
    while no daemon read it are that start's, not those of a segment the last state may
    already have reserved for a start that never happened."""
    refused: dict[str, quarantine.Note]
    """Checkpoints whose newest verdict in the journal is a quarantine (not followed by a
    new commit of that name, nor a deletion): should one still lie in the checkpoint folder
    (its move failed), the verdict stands."""
    slurm: SlurmSegments
    """The run's earlier Slurm job segments."""


def last_state_record(
    journal_path: Path, quarantine_notes: dict[str, quarantine.Note] | None = None
) -> JournalTail:
    """The journal's tail for a starting daemon, in one pass over the journal; the same
    pass fills `quarantine_notes` with why each quarantined checkpoint was set aside."""
    state = None
    last_kind = None
    spawned_seg = 0
    refused: dict[str, quarantine.Note] = {}
    slurm_gaps: list[float] = []
    last_t: float | None = None
    for record in read_records(journal_path):
        last_kind = record.get("kind")
        t = record.get("t")
        last_t = float(t) if isinstance(t, int | float) else last_t
        if last_kind in ("state", "spawn", "repeated"):
            # A fast crash loop's folded cycles: the newest state and start it counted.
            state = state_of(record) or state
            spawned_seg = spawned_seg_of(record) or spawned_seg
        elif last_kind in ("checkpoint", "delete") and isinstance(record.get("name"), str):
            refused.pop(record["name"], None)
        elif last_kind == "slurm_job":
            gap = record.get("gap_s")
            slurm_gaps.append(float(gap) if isinstance(gap, int | float) else 0.0)
        elif last_kind == "quarantine" and isinstance(record.get("name"), str):
            refused[record["name"]] = quarantine.note_of(record)
            if quarantine_notes is not None:
                quarantine.remember(quarantine_notes, record)
    clean = last_kind in (None, "daemon_exit")
    segments = SlurmSegments(len(slurm_gaps), sum(slurm_gaps), last_t)
    return JournalTail(state, clean, spawned_seg, refused, segments)


def start_metrics(
    cfg: Config,
    journal: Journal,
    snapshot: Callable[[], dict[str, Any]],
    loop: asyncio.AbstractEventLoop,
) -> MetricsServer | None:
    """The /metrics server if [metrics] listen is set; None if unset or it cannot listen."""
    if cfg.metrics.listen is None:
        return None
    from trainwarden.supervisor.serve.metrics import start_metrics_server

    try:
        server = start_metrics_server(
            cfg.metrics.listen, snapshot, allow_remote=cfg.metrics.allow_remote, loop=loop
        )
    except OSError as exc:
        # Supervision matters more than the figures: carry on without them.
        journal.append(
            {
                "kind": "metrics_failed",
                "listen": cfg.metrics.listen,
                "error": exc.strerror or str(exc),
            }
        )
        return None
    journal.append({"kind": "metrics_listening", "url": server.url})
    return server


# ----------------------------------------------------------------------------- links


class WatchedPath(NamedTuple):
    """A path the daemon watches, as configured and as resolved once at start."""

    kind: Literal["checkpoint_dir", "log_path"]
    """Its journal record's kind."""
    configured: Path
    resolved: Path


def watched_paths(cfg: Config, store: CheckpointStore) -> list[WatchedPath]:
    """The checkpoint directory (as the store resolved it) and the run log, resolved now."""
    return [
        WatchedPath("checkpoint_dir", cfg.checkpoint_dir, store.dir),
        WatchedPath("log_path", cfg.log_path, Path(os.path.realpath(cfg.log_path))),
    ]


def with_resolved_log(cfg: Config, watched: list[WatchedPath]) -> Config:
    """`cfg` with run.log the resolved log: the trainer writes and the follower reads that
    one file, whatever the link does later, and a follower watching the link's folder
    would never hear of writes in the target's. (An absolute run.log joins to itself.)"""
    log_path = next(w.resolved for w in watched if w.kind == "log_path")
    if log_path == cfg.log_path:
        return cfg
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, log=str(log_path)))


def journal_links(journal: Journal, watched: list[WatchedPath]) -> None:
    """One record per watched path that a link sends elsewhere, with where it went."""
    for path in watched:
        if path.configured != path.resolved:
            link: ResolvedLinkFacts = {
                "configured": str(path.configured),
                "resolved": str(path.resolved),
            }
            if path.kind == "checkpoint_dir":
                journal.append({"kind": "checkpoint_dir", **link})
            else:
                journal.append({"kind": "log_path", **link})


def _resolve_all(watched: list[WatchedPath]) -> list[Path]:
    return [Path(os.path.realpath(path.configured)) for path in watched]


async def report_moved_links(
    watched: list[WatchedPath], journal: Journal, every_s: float = LINK_CHECK_S
) -> None:
    """Journal "<kind>_moved" once each time a watched path comes to resolve elsewhere.

    The daemon goes on watching what it resolved at start: following a link's new target
    mid-run would mix two directories' checkpoints. Resolving is a few lstat calls, in a
    thread all the same: a hung network disk must not hang the loop.
    """
    seen = [path.resolved for path in watched]
    while True:
        await asyncio.sleep(every_s)
        try:
            now = await asyncio.to_thread(_resolve_all, watched)
        except OSError as exc:  # a link loop, say: nothing to compare this time
            log.warning("cannot resolve the watched paths: %s", exc)
            continue
        for i, (path, target) in enumerate(zip(watched, now, strict=True)):
            if target == seen[i]:
                continue
            moved: MovedLinkFacts = {
                "configured": str(path.configured),
                "was": str(seen[i]),
                "now": str(target),
                "watching": str(path.resolved),
            }
            if path.kind == "checkpoint_dir":
                journal.append({"kind": "checkpoint_dir_moved", **moved})
            else:
                journal.append({"kind": "log_path_moved", **moved})
            log.warning(
                "%s now resolves to %s (was %s); still watching %s until the daemon restarts",
                path.configured,
                target,
                seen[i],
                path.resolved,
            )
            seen[i] = target
