"""What a starting daemon reads and opens besides the loop: the policy's rules from the
config, the journal's last state, the optional metrics server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.store.journal import Journal, read_records

if TYPE_CHECKING:
    from trainwarden.supervisor.serve.metrics import MetricsServer


def rules_from(cfg: Config) -> core.Rules:
    return core.Rules(
        keep_last=cfg.checkpoints.keep_last,
        backoff_initial_s=cfg.restart.backoff_initial_s,
        backoff_max_s=cfg.restart.backoff_max_s,
        max_restarts_without_progress=cfg.restart.max_restarts_without_progress,
        stall_timeout_s=cfg.restart.stall_timeout_s,
        stop_timeout_s=cfg.trainer.stop_timeout_s,
        max_loss=cfg.telemetry.max_loss,
        divergence_retries=cfg.restart.divergence_retries,
        suspect_window_steps=cfg.restart.suspect_window_steps,
        max_fallbacks=cfg.restart.max_fallbacks,
        max_step_jump=cfg.checkpoints.max_step_jump,
        total_steps=cfg.trainer.total_steps,
        mirror=cfg.mirror.path is not None,
        mirror_keep_last=cfg.mirror.keep_last,
    )


def last_state_record(journal_path: Path) -> tuple[dict[str, Any] | None, bool]:
    """(the newest persisted state, whether the previous daemon exited cleanly)."""
    state = None
    last_kind = None
    for record in read_records(journal_path):
        last_kind = record.get("kind")
        if last_kind == "state":
            state = record.get("state")
    clean = last_kind in (None, "daemon_exit")
    return state, clean


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
            "metrics_failed", {"listen": cfg.metrics.listen, "error": exc.strerror or str(exc)}
        )
        return None
    journal.append("metrics_listening", {"url": server.url})
    return server
