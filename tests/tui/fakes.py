"""Fixed data for the TUI: a data source that replays a frozen run, and a frozen clock."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

from trainwarden.supervisor.errors import CommandRefused
from trainwarden.tui.messages import (
    Connected,
    Disconnected,
    HistoryReceived,
    StatusReceived,
    TopicPushed,
)
from trainwarden.tui.model import Clock
from trainwarden.tui.source import HistoryWanted, Post

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class FrozenClock(Clock):
    def __init__(self, wall: float = NOW, mono: float = 1000.0) -> None:
        self.wall = wall
        self.mono = mono

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


def loss_history(
    points: int, steps: int = 12_000, markers: bool = True, start: int | None = None
) -> dict[str, Any]:
    """A smooth, decaying curve over steps `start`..`steps` (default: from step 1)
    decimated to `points` buckets, like the daemon's reply."""
    begin = max(start or 1, 1)
    count = max(steps - begin + 1, 1)
    points = max(min(points, count), 1)
    width = count / points
    step, mean = [], []
    for i in range(points):
        first = begin + int(i * width)
        x = first / steps
        step.append(first)
        mean.append(round(2.1 + 3.4 * math.exp(-6 * x) + 0.05 * math.sin(40 * x), 4))
    return {
        "step": step,
        "min": [m - 0.05 for m in mean],
        "mean": mean,
        "max": [m + 0.05 for m in mean],
        "nonfinite": [0] * points,
        "first_step": begin,
        "last_step": steps,
        "count": count,
        "markers": [
            {"step": 4000, "kind": "crash"},
            {"step": 3900, "kind": "restart"},
            {"step": 9000, "kind": "pivot"},
        ]
        if markers
        else [],
        "collapse_loss": math.log(256),
    }


def checkpoint(step: int, age_s: float, **flags: Any) -> dict[str, Any]:
    return {
        "step": step,
        "name": f"step_{step:06d}.bin",
        "path": f"/runs/demo/checkpoints/step_{step:06d}.bin",
        "bytes": 1_468_008,
        "mtime": NOW - age_s,
        "verified": True,
        "pinned": False,
        "next_to_delete": False,
        **flags,
    }


def status() -> dict[str, Any]:
    return {
        "protocol": 1,
        "version": "0.1.0",
        "run": "gpt2-small-mix",
        "run_dir": "/runs/gpt2-small-mix",
        "daemon_pid": 4100,
        "total_steps": 50_000,
        "state": "running",
        "detail": {},
        "trainer_pid": 4242,
        "trainer_uptime_s": 3 * 3600 + 25 * 60 + 7,
        "restarts": 2,
        "restarts_without_progress": 0,
        "seg": 3,
        "step": 12_000,
        "loss": 2.3187,
        "loss_ema": 2.3402,
        "loss_avg": 2.35,
        "dt": 0.2484,
        "tokens_per_s": 65_958.0,
        "mfu": 0.4123,
        "mfu_avg": 0.3987,
        "mfu_unknown_reason": None,
        "steps_per_min": 241.5,
        "eta_s": 38_000 * 60 / 241.5,
        "collapse_loss": math.log(256),
        "last_checkpoint_step": 12_000,
        "last_checkpoint_age_s": 42.0,
        "next_checkpoint_step": 12_500,
        "resume_audit": {
            "status": "verified",
            "checkpoint_step": 11_500,
            "checked": 87,
            "expected": 87,
        },
        "gpu": {
            "name": "NVIDIA GeForce RTX 4090",
            "index": 0,
            "util_percent": 98,
            "mem_used_bytes": int(21.4 * 2**30),
            "mem_total_bytes": 24 * 2**30,
            "temperature_c": 71,
            "power_w": 402.3,
            "power_limit_w": 450.0,
            "sm_clock_mhz": 2610,
            "throttle_reasons": [],
            "ecc_volatile_errors": None,
            "alarming": False,
        },
        "gpu_status": "ok",
        "host": {
            "trainer_cpu_percent": 101.5,
            "trainer_rss_bytes": int(3.2 * 2**30),
            "trainer_processes": 5,
            "mem_used_bytes": int(18.4 * 2**30),
            "mem_total_bytes": 64 * 2**30,
            "disk_free_bytes": 812 * 2**30,
            "disk_total_bytes": 1863 * 2**30,
            "load_avg_1m": 2.13,
            "load_avg_5m": 2.01,
            "load_avg_15m": 1.97,
        },
        "disk_low": False,
        "disk_full": False,
        "disk_full_files": [],
        "checkpoints": [
            checkpoint(10_000, 2 * 3600, pinned=True),
            checkpoint(11_000, 3600, next_to_delete=True),
            checkpoint(11_500, 1800),
            checkpoint(12_000, 42),
        ],
        "quarantined": [{"name": "step_009500.bin"}],
    }


def bandit() -> dict[str, Any]:
    return {
        "step": 12_000,
        "arms": {
            "docs": {"pulls": 3120, "ema_reward": 0.4712, "prob": 0.20, "cap": 0.6, "floor": 0.2},
            "code": {"pulls": 5210, "ema_reward": 0.5233, "prob": 0.55, "cap": 1.0, "floor": 0.1},
            "tests": {"pulls": 3670, "ema_reward": 0.4981, "prob": 0.25, "cap": 1.0, "floor": 0.0},
        },
        "zombies": ["wiki"],
        "policy": {},
        "phase": {"pivots": 1, "steps_in_phase": 3000, "started_at_step": 9000},
    }


def samples() -> dict[str, Any]:
    return {
        "samples": [
            {"step": 11_500, "arm": "docs", "text": "old docs sample", "t": NOW - 1900},
            {
                "step": 12_000,
                "arm": "docs",
                "text": "the request handler returns [bold]early[/bold]",
                "t": NOW,
            },
            {
                "step": 12_000,
                "arm": "code",
                "text": "def parse(line):\x1b[31m return line.split()",
                "t": NOW,
            },
            {"step": 12_000, "arm": "tests", "text": "assert parse('a b') == ['a', 'b']", "t": NOW},
        ]
    }


def events() -> list[dict[str, Any]]:
    def record(offset: float, kind: str, **fields: Any) -> dict[str, Any]:
        t = NOW - offset
        hms = f"{int(t // 3600 % 24):02d}:{int(t // 60 % 60):02d}:{int(t % 60):02d}"
        return {"ts": f"2025-12-31T{hms}.000000Z", "t": t, "kind": kind, **fields}

    return [
        record(5 * 3600, "daemon_start", pid=4100, version="0.1.0"),
        record(
            4 * 3600,
            "crash",
            cause="exit status 1: CUDA error: an illegal memory access",
            last_step=4000,
        ),
        record(4 * 3600 - 5, "restart_scheduled", backoff_s=5.0),
        record(4 * 3600 - 10, "spawn", seg=2, resume={"step": 3900}, pivot=False),
        record(3 * 3600 + 1800, "resume_verified", status="verified", checked=100),
        record(3 * 3600 + 30, "spawn", seg=3, resume={"step": 9000}, pivot=True),
        record(42, "checkpoint", step=12_000, name="step_012000.bin"),
    ]


class StaticSource:
    """Posts a frozen run once; answers commands from `replies` (or refuses them)."""

    def __init__(
        self,
        status: dict[str, Any] | None = None,
        disconnected: str | None = None,
        replies: dict[str, Any] | None = None,
        log_path: Path | None = None,
        journal: list[dict[str, Any]] | None = None,
    ) -> None:
        self.status = status or globals()["status"]()
        self.journal = events() if journal is None else journal
        self.disconnected = disconnected
        self.replies = replies or {}
        self.log_path = log_path
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.history_wanted = 0
        self.history_steps = 12_000
        """The newest step of the frozen run's loss history."""
        self.history_requests: list[dict[str, Any]] = []
        self._post: Post | None = None
        self._history_args: HistoryWanted | None = None

    def history(self) -> dict[str, Any]:
        """The history reply for what the app asks now (points and step range)."""
        assert self._history_args is not None
        args = dict(self._history_args())
        self.history_requests.append(args)
        return loss_history(args["points"], self.history_steps, start=args.get("start"))

    async def run(self, post: Post, history_args: HistoryWanted) -> None:
        self._post, self._history_args = post, history_args
        post(
            Connected({"protocol": 1, "run": self.status["run"], "run_dir": self.status["run_dir"]})
        )
        post(TopicPushed("events", self.journal))
        post(TopicPushed("bandit", bandit()))
        post(TopicPushed("samples", samples()))
        post(StatusReceived(self.status))
        post(HistoryReceived(self.history()))
        if self.disconnected:
            post(Disconnected(self.disconnected, 4.0))
        await asyncio.Event().wait()

    def want_history(self) -> None:
        self.history_wanted += 1
        if self._post is not None and self._history_args is not None:
            self._post(HistoryReceived(self.history()))

    async def request(self, cmd: str, timeout: float | None = 30.0, **args: Any) -> Any:
        self.requests.append((cmd, args))
        reply = self.replies.get(cmd)
        if reply is None:
            raise CommandRefused("not_implemented", f"{cmd} is not available in this version")
        return reply
