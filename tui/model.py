"""What the TUI knows about the run: the newest value of every topic, and when it came.

Plain data, no widgets and no I/O, so a test can fill one by hand. Each panel reads the
fields it shows; `versions` counts changes per panel so the render tick only redraws
panels whose data moved. Durations the daemon reports once (trainer uptime, backoff
countdown, checkpoint age) are advanced with the local clock from the moment they
arrived, so the two machines' wall clocks never need to agree.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from trainwarden.supervisor.protocol import (
    STATE_KEYS,
    STEPPING,
    TELEMETRY_KEYS,
    TELEMETRY_NOTICES,
)

EVENTS_KEPT = 200
GPU_SAMPLES_KEPT = 150
"""GPU pushes kept for the sparklines: five minutes at the daemon's 2 s cadence."""
HEADER_KEYS = ("step", "eta_s")
"""Telemetry fields the header's progress bar shows."""
SPARK_WINDOW_S = 300.0
"""The tokens/s sparkline covers this many seconds of telemetry frames."""
SPARK_SAMPLE_S = 2.0
"""At most one tokens/s sample per this many seconds is kept (a bounded deque)."""
STALE_AFTER_S = 30.0
"""A step's figures older than this (and than a few of its steps) are shown as stale."""

PANELS = ("header", "telemetry", "chart", "gpu", "checkpoints", "bandit", "events")


class Clock:
    """Wall time for ages of files, monotonic time for everything measured locally."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass
class Stamped:
    """A value and the local monotonic time it arrived."""

    value: Any = None
    at: float = 0.0


@dataclass
class RunModel:
    clock: Clock = field(default_factory=Clock)
    connected: bool = False
    ever_connected: bool = False
    disconnect_reason: str | None = None
    retry_at: float | None = None
    hello: dict[str, Any] = field(default_factory=dict)
    total_steps: int | None = None
    state: Stamped = field(default_factory=Stamped)
    state_pushed: bool = False
    """The state topic has spoken on this connection: from then on it alone sets the state."""
    telemetry: Stamped = field(default_factory=Stamped)
    gpu: dict[str, Any] | None = None
    gpu_status: str | None = None
    gpu_seen: bool = False
    gpu_samples: deque[dict[str, Any]] = field(
        default_factory=lambda: deque(maxlen=GPU_SAMPLES_KEPT)
    )
    """The newest GPU pushes, oldest first (the sparklines' data)."""
    host: dict[str, Any] | None = None
    disk_low: bool = False
    disk_full: list[str] | None = None
    """Files whose writes the daemon holds in memory for want of space (None: none)."""
    checkpoints: dict[str, Any] | None = None
    bandit: dict[str, Any] | None = None
    samples: dict[str, Any] | None = None
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    history: dict[str, Any] | None = None
    overlay_run: str | None = None
    """The other run the chart overlays, as asked for (`--compare`, the picker)."""
    overlay: dict[str, Any] | None = None
    """Its history (history_of), once the daemon has answered."""
    saving: bool = False
    """A save the operator asked for is waiting for its checkpoint."""
    handles: list[str] | None = None
    """Of SIGTERM and SIGUSR1, those the trainer catches (status; None: unknown)."""
    versions: Counter[str] = field(default_factory=Counter)
    tokens_per_s: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=int(SPARK_WINDOW_S / SPARK_SAMPLE_S) + 2)
    )
    """(local monotonic time, tokens/s) of the recent telemetry frames, for the sparkline."""

    # -------------------------------------------------------------- updates

    def touch(self, *panels: str) -> None:
        for panel in panels:
            self.versions[panel] += 1

    def set_connected(self, hello: dict[str, Any]) -> None:
        self.connected = True
        self.ever_connected = True
        self.disconnect_reason = None
        self.retry_at = None
        self.hello = hello if isinstance(hello, dict) else {}
        # The subscribe snapshot brings the journal's newest records again.
        self.events.clear()
        self.state_pushed = False
        self.touch(*PANELS)

    def set_disconnected(self, reason: str, retry_in_s: float | None) -> None:
        self.connected = False
        self.disconnect_reason = reason
        self.retry_at = None if retry_in_s is None else self.clock.monotonic() + retry_in_s
        self.touch(*PANELS)

    def apply_status(self, status: dict[str, Any]) -> None:
        if not isinstance(status, dict):
            return
        now = self.clock.monotonic()
        if isinstance(status.get("total_steps"), int):
            self.total_steps = status["total_steps"]
        if "run" in status and "run" not in self.hello:
            self.hello = {**self.hello, "run": status["run"]}
        if not self.state_pushed:
            # A state push can reach us after a newer status reply (the daemon sends its
            # queued replies before its coalesced topic frames), and state is pushed only
            # when it changes: once pushes flow, a status reply must not overwrite them.
            self.state = Stamped({k: status.get(k) for k in STATE_KEYS}, now)
        telemetry = {k: status.get(k) for k in TELEMETRY_KEYS}
        self.telemetry = Stamped(telemetry, now)
        self._sample_speed(telemetry, now)
        self.gpu = status.get("gpu") if isinstance(status.get("gpu"), dict) else None
        self.gpu_status = status.get("gpu_status")
        self.gpu_seen = True
        if isinstance(status.get("host"), dict):
            self.host = status["host"]
        self.disk_low = status.get("disk_low") is True
        full = status.get("disk_full_files")
        self.disk_full = (
            [f for f in full if isinstance(f, str)] or None
            if status.get("disk_full") is True and isinstance(full, list)
            else None
        )
        handles = status.get("handles")
        self.handles = (
            [h for h in handles if isinstance(h, str)] if isinstance(handles, list) else None
        )
        if isinstance(status.get("checkpoints"), list):
            self.checkpoints = {
                "checkpoints": status["checkpoints"],
                "quarantined": status.get("quarantined") or [],
            }
        self.touch("header", "telemetry", "gpu", "checkpoints", "chart")

    def apply_topic(self, topic: str, data: Any) -> None:
        now = self.clock.monotonic()
        if topic == "telemetry" and isinstance(data, dict):
            before = self.telemetry.value or {}
            # The header shows the notices, the progress and the ETA: a frame that changes
            # one of them redraws it.
            header_changed = any(
                data.get(key) != before.get(key) for key in (*TELEMETRY_NOTICES, *HEADER_KEYS)
            )
            self.telemetry = Stamped(data, now)
            self._sample_speed(data, now)
            self.touch("telemetry", *(("header",) if header_changed else ()))
        elif topic == "state" and isinstance(data, dict):  # not a kind: the topic
            self.state = Stamped(data, now)
            self.state_pushed = True
            self.touch("header", "telemetry")
        elif topic == "gpu":
            self.gpu = data if isinstance(data, dict) else None
            self.gpu_seen = True
            if self.gpu is not None:
                self.gpu_samples.append(self.gpu)
            self.touch("gpu")
        elif topic == "host" and isinstance(data, dict):
            self.host = data
            self.touch("telemetry")
        elif topic == "checkpoints" and isinstance(data, dict):
            self.checkpoints = data
            # The telemetry panel's stall belongs to a listed checkpoint: drawn again too.
            self.touch("checkpoints", "telemetry")
        elif topic == "bandit" and isinstance(data, dict):
            self.bandit = data
            self.touch("bandit")
        elif topic == "samples" and isinstance(data, dict):
            self.samples = data
            self.touch("bandit")
        elif topic == "events":
            # The subscribe snapshot is a list (newest last); each push is one record.
            records = data if isinstance(data, list) else [data]
            self.events.extend(r for r in records if isinstance(r, dict))
            self.touch("events")

    def _sample_speed(self, telemetry: dict[str, Any], now: float) -> None:
        value = telemetry.get("tokens_per_s")
        if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
            return
        samples = self.tokens_per_s
        if len(samples) > 1 and now - samples[-2][0] < SPARK_SAMPLE_S:
            samples[-1] = (now, float(value))  # the newest sample follows the newest frame
        else:
            samples.append((now, float(value)))
        while samples and samples[0][0] < now - SPARK_WINDOW_S:
            samples.popleft()

    def apply_history(self, history: dict[str, Any]) -> None:
        if isinstance(history, dict):
            self.history = history
            self.touch("chart")

    def set_overlay(self, run: str | None, history: dict[str, Any] | None = None) -> None:
        self.overlay_run = run
        self.overlay = history if run is not None and isinstance(history, dict) else None
        self.touch("chart")

    # -------------------------------------------------------------- derived values

    @property
    def run_name(self) -> str:
        return str(self.hello.get("run") or "run")

    @property
    def phase(self) -> str | None:
        state = self.state.value or {}
        value = state.get("state")
        return value if isinstance(value, str) else None

    @property
    def detail(self) -> dict[str, Any]:
        detail = (self.state.value or {}).get("detail")
        return detail if isinstance(detail, dict) else {}

    def since(self, stamped: Stamped) -> float:
        return max(self.clock.monotonic() - stamped.at, 0.0)

    def trainer_uptime_s(self) -> float | None:
        uptime = (self.state.value or {}).get("trainer_uptime_s")
        if not isinstance(uptime, int | float):
            return None
        return uptime + (self.since(self.state) if self.connected else 0.0)

    def restart_in_s(self) -> float | None:
        restart_in = self.detail.get("restart_in_s")
        if not isinstance(restart_in, int | float):
            return None
        return max(restart_in - self.since(self.state), 0.0)

    def slurm_ends_in_s(self) -> float | None:
        """Seconds until Slurm ends the daemon's job, counted down from the view's figure."""
        job = (self.state.value or {}).get("slurm")
        ends_in = job.get("ends_in_s") if isinstance(job, dict) else None
        if not isinstance(ends_in, int | float):
            return None
        return max(ends_in - (self.since(self.state) if self.connected else 0.0), 0.0)

    @property
    def stepping(self) -> bool:
        """The trainer is stepping now: its speed, MFU now and ETA are true."""
        return self.connected and self.phase in STEPPING

    def _telemetry_age(self, key: str) -> float | None:
        """An age the telemetry frame reports, advanced by the local clock since it came."""
        age = (self.telemetry.value or {}).get(key)
        if not isinstance(age, int | float):
            return None
        return age + (self.since(self.telemetry) if self.connected else 0.0)

    def checkpoint_age_s(self) -> float | None:
        """Since the newest checkpoint's commit (its file's time, as the daemon read it)."""
        return self._telemetry_age("last_checkpoint_age_s")

    def newest_checkpoint(self) -> tuple[Any, float | None]:
        """The newest checkpoint a restart could resume from, and its age: the telemetry's,
        unless the checkpoints view lists it as quarantined or set aside (a pivot or a
        rollback has just moved it), then the newest verified one the view lists."""
        step = (self.telemetry.value or {}).get("last_checkpoint_step")
        view = self.checkpoints or {}
        moved = {q.get("step") for q in view.get("quarantined") or [] if isinstance(q, dict)}
        if step is None or step not in moved:
            return step, self.checkpoint_age_s()
        listed = [
            c
            for c in view.get("checkpoints") or []
            if isinstance(c, dict) and isinstance(c.get("step"), int) and c.get("verified", True)
        ]
        if not listed:
            return None, None
        newest = max(listed, key=lambda c: c["step"])
        mtime = newest.get("mtime")
        age = max(self.clock.time() - mtime, 0.0) if isinstance(mtime, int | float) else None
        return newest["step"], age

    def step_age_s(self) -> float | None:
        """Since the newest step line: how old the step's loss and figures are."""
        return self._telemetry_age("step_age_s")

    def last_line_age_s(self) -> float | None:
        return self._telemetry_age("last_line_age_s")

    def newest_checkpoint_stall_s(self) -> float | None:
        """How long the step loop waited for the newest checkpoint's save, when the newest
        save report names that checkpoint (None otherwise: a stall beside a checkpoint is
        that checkpoint's, never an older or a newer save's)."""
        t = self.telemetry.value or {}
        stall, name, step = (
            t.get("last_save_stall_s"),
            t.get("last_save_name"),
            t.get("last_checkpoint_step"),
        )
        if not isinstance(stall, int | float) or name is None or step is None:
            return None
        listed = (self.checkpoints or {}).get("checkpoints") or []
        shown = [c for c in listed if isinstance(c, dict) and c.get("step") == step]
        return float(stall) if shown and shown[-1].get("name") == name else None

    def step_stale(self) -> bool:
        """The step's figures are older than their expected refresh (a few steps' time)."""
        age = self.step_age_s()
        if age is None:
            return False
        dt = (self.telemetry.value or {}).get("dt")
        expected = 5 * dt if isinstance(dt, int | float) and dt > 0 else 0.0
        return age > max(STALE_AFTER_S, expected)

    def speed_samples(self) -> list[float]:
        """tokens/s of the last SPARK_WINDOW_S, oldest first."""
        now = self.clock.monotonic()
        return [v for t, v in self.tokens_per_s if t >= now - SPARK_WINDOW_S]

    def unsaved_steps(self) -> int | None:
        """Steps logged since the newest verified checkpoint (what a kill would lose)."""
        step = (self.telemetry.value or {}).get("step")
        if not isinstance(step, int):
            return None
        listed = (self.checkpoints or {}).get("checkpoints") or []
        steps = [c.get("step") for c in listed if isinstance(c, dict)]
        newest = max((s for s in steps if isinstance(s, int)), default=0)
        return max(step - newest, 0)

    def retry_in_s(self) -> float | None:
        if self.retry_at is None:
            return None
        return max(self.retry_at - self.clock.monotonic(), 0.0)

    def hints(self) -> list[str]:
        """The daemon's one-line hints for the user: a config file changed since the daemon
        read it, a parser that matches no line, files in the checkpoint directory the format
        does not read (untrusted text: clean it)."""
        t = self.telemetry.value or {}
        found = []
        # An edit of trainwarden.toml the running daemon does not follow, first: until the
        # user acts on it, the run goes on under settings they think they changed.
        changed = (self.state.value or {}).get("config_notice")
        if isinstance(changed, str) and changed:
            found.append(changed)
        notice = t.get("parser_no_match")
        if isinstance(notice, dict) and isinstance(notice.get("hint"), str):
            found.append(notice["hint"])
        unrecognised = t.get("checkpoints_unrecognised")
        if isinstance(unrecognised, list):
            found += [
                u["hint"]
                for u in unrecognised
                if isinstance(u, dict) and isinstance(u.get("hint"), str)
            ]
        return found

    def arm_names(self) -> list[str]:
        arms = (self.bandit or {}).get("arms")
        return [str(name) for name in arms] if isinstance(arms, dict) else []

    def latest_samples(self) -> dict[str, dict[str, Any]]:
        """The newest sample of each arm."""
        samples = (self.samples or {}).get("samples")
        latest: dict[str, dict[str, Any]] = {}
        if not isinstance(samples, list):
            return latest
        for sample in samples:
            if not isinstance(sample, dict):
                continue
            arm = str(sample.get("arm"))
            step = sample.get("step")
            previous = latest.get(arm)
            if previous is None or _step_of(step) >= _step_of(previous.get("step")):
                latest[arm] = sample
        return latest

    @property
    def populated(self) -> bool:
        """Every panel has something real to show (the benchmark's "complete frame")."""
        telemetry = self.telemetry.value or {}
        return (
            self.connected
            and self.phase is not None
            and telemetry.get("step") is not None
            and self.history is not None
            and self.checkpoints is not None
            and self.gpu_seen
            and self.bandit is not None
            and bool(self.events)
        )


def _step_of(value: Any) -> int:
    return value if isinstance(value, int) else -1
