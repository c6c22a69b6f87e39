"""The chaos soak: a real daemon supervising a real trainer through a seeded storm.

The trainer is the reference trainer (the slow tier's soaks) or tests/scripted_trainer.py
with a bandit, slowed saves and one NaN and one hang (the default soak: the daemon's
invariants are the point there, and the scripted trainer starts in a tenth of a second).

One `Soak` drives one run: it writes the config, optionally puts the checkpoint directory
on a small tmpfs in a private mount namespace (so a full disk can be staged), starts the
watcher process (tests/chaos/watcher.py) and the daemon, then walks a seeded schedule of
faults and operator commands keyed to training steps. When the run has finished it shuts
the daemon down and tests/chaos/judge.py checks the ten invariants from the journal, the
watcher's records, the files and the reference runs, and builds the summary.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tests.chaos.watcher import run_processes
from tests.support import (
    PYTHON,
    REFERENCE_TRAINER,
    REPO,
    SCRIPTED_TRAINER,
    DaemonProcess,
    belongs_to_run,
    kill_quietly,
    reference_run,
    scripted_argv,
    trainer_argv,
    wait_for,
)
from tests.support.procs import argv_of, runs_a_trainer
from trainwarden.supervisor.contract import checkpoint_name
from trainwarden.supervisor.errors import CommandRefused, ProtocolError
from trainwarden.supervisor.protocol import Client

STEP_LINE = re.compile(r"^step: (\d+), loss: ([^,]+),")
CKPT_NAME = re.compile(r"^step_(\d{6,})\.bin$")
HEADER = struct.Struct("<ii")
NEW_POLICY: dict[str, Any] = {"caps": {"docs": 0.5}, "floors": {"tests": 0.2}}
PLANTS = ("truncate", "flip_step", "flip_n_params", "nan_weight", "double_weights")
"""Corruptions planted in the newest checkpoint while the daemon is down, in turn. The
size, header and NaN ones fail andrea-bin verification at the next start-up; doubled
weights stay finite and pass it, and only the digest the previous daemon persisted for
that name (its `state` record) shows the change."""
FUTURE_STEP = 99_999_999
"""Far-future plants are named for this step (one less for each further plant): valid
header, finite contents, far beyond anything the run logs."""
DOUBLED_WEIGHTS = 2000
"""How many weights a corruption in place doubles."""
TMPFS_SIZE = "160m"
# Command outcomes that are answers, not failures: another command held the operator
# lock, the state did not allow it (a kill landed while a save waited), a stop pre-empted
# a waiting save, or the trainer does not catch SIGUSR1 so a save is refused rather than sent.
ACCEPTED_REFUSALS = {"busy", "wrong_state", "superseded", "unsupported"}
WRAPPER = Path(__file__).resolve().parent / "forking_wrapper.py"
"""The trainer wrapper that double-forks a long-lived helper (see its docstring)."""


# ----------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class SoakPlan:
    """How big a storm: the run's size and how many faults of each kind."""

    steps: int
    save_every: int
    seed: int
    trainer_kills: int
    kills_in_write: int
    daemon_kills: int
    """Each one plants a corrupt newest checkpoint while the daemon is down (the next of
    PLANTS), and every other one, from the first, a far-future checkpoint too; every
    second one is a double kill (restart, SIGKILL again at once, restart)."""
    enospc: int
    save_pairs: int
    stop_starts: int
    save_kills: int
    corruptions: int = 1
    """Committed checkpoints the daemon has verified, rewritten in place (same size,
    doubled weights: still finite) while it runs."""
    future_plants: int = 1
    """Far-future checkpoints planted while the daemon runs."""
    pivot: bool = True
    keep_last: int = 3
    stall_timeout_s: float = 15.0
    wrapper: tuple[str, ...] | None = None
    """Run the trainer behind tests/chaos/forking_wrapper.py with these options (None: the
    reference trainer alone). The wrapper leaves a helper per start that only the daemon's
    containment ends; with "--stay" it is the main process and ignores SIGUSR1."""
    signal_target: str = "group"
    stop_timeout_s: float = 4.0
    slow_save_s: float = 0.15
    train_seed: int = 1337
    trainer: str = "reference"
    """"reference" (python -m trainwarden.trainer) or "scripted" (tests/scripted_trainer.py)."""
    script_breaks: int = 0
    """The scripted trainer's script (a copy in the run directory) broken and the trainer
    killed: its next starts die at once, before reading a checkpoint; repaired after the
    run halts in crash_loop (or a few failed starts), then started again."""


SCRIPTED_N_PARAMS = 120_576
"""The scripted trainer's checkpoints are the size of the reference trainer's tiny ones."""
BROKEN_SCRIPT = "def broken(:\n"


def plain_trainer_argv(plan: SoakPlan, *extra: str, script: Path | None = None) -> list[str]:
    """The plan's trainer without the wrapper, with `extra` arguments (`script`: the copy
    of the scripted trainer the soak breaks and repairs)."""
    if plan.trainer == "scripted":
        argv = scripted_argv(
            *("--steps", str(plan.steps), "--save-every", str(plan.save_every), "--dt", "0.01"),
            *("--n-params", str(SCRIPTED_N_PARAMS), "--usr1", "save", "--arms", "docs,code,tests"),
            *extra,
        )  # fmt: skip
        if script is not None:
            argv[1] = str(script)
        return argv
    return trainer_argv(plan.steps, plan.save_every, *extra, seed=plan.train_seed)


def fault_args(plan: SoakPlan, nan_step: int, hang_step: int) -> tuple[str, ...]:
    """The trainer's own faults: one NaN and one hang (each once), and slowed saves."""
    if plan.trainer == "scripted":
        return (
            *("--nan-at", str(nan_step), "--nan-once", "--hang-at", str(hang_step)),
            *("--slow-save", str(plan.slow_save_s)),
        )  # fmt: skip
    return ("--nan-at-step", str(nan_step), "--hang-at-step", str(hang_step))


@dataclass
class Event:
    step: int
    kind: str
    args: dict[str, Any] = field(default_factory=dict)


MUST_INJECT = ("corrupt_committed", "plant_future")
"""Fault kinds the judge fails a soak for not having injected (invariant 7)."""


def make_schedule(plan: SoakPlan) -> tuple[list[Event], int, int]:
    """(events sorted by step, NaN step, hang step), all from plan.seed."""
    rng = random.Random(plan.seed)
    kinds: list[Event] = []
    kinds += [Event(0, "trainer_kill") for _ in range(plan.trainer_kills)]
    kinds += [Event(0, "trainer_kill_in_write") for _ in range(plan.kills_in_write)]
    planted = 0
    for i in range(plan.daemon_kills):
        double = i % 2 == 1
        plants = [PLANTS[(planted + k) % len(PLANTS)] for k in range(1 + double)]
        planted += len(plants)
        kinds.append(
            Event(0, "daemon_kill", {"plants": plants, "double": double, "future": i % 2 == 0})
        )
    kinds += [Event(0, "enospc") for _ in range(plan.enospc)]
    kinds += [Event(0, "save_pair") for _ in range(plan.save_pairs)]
    kinds += [Event(0, "stop_start") for _ in range(plan.stop_starts)]
    kinds += [Event(0, "save_kill") for _ in range(plan.save_kills)]
    kinds += [Event(0, "corrupt_committed") for _ in range(plan.corruptions)]
    kinds += [Event(0, "plant_future") for _ in range(plan.future_plants)]
    kinds += [Event(0, "broken_script") for _ in range(plan.script_breaks)]
    kinds += [Event(0, "nan"), Event(0, "hang")]
    rng.shuffle(kinds)
    # The judge requires these to have been injected, and a slow fault before one near the
    # end (a daemon kill takes about 2 s) can let the run finish first: none in the last
    # third, each swapped with an event of the first two thirds.
    early = len(kinds) * 2 // 3
    for i in range(early, len(kinds)):
        if kinds[i].kind in MUST_INJECT:
            j = rng.choice([k for k in range(early) if kinds[k].kind not in MUST_INJECT])
            kinds[i], kinds[j] = kinds[j], kinds[i]
    if plan.pivot:
        kinds.insert(max(0, round(0.85 * len(kinds))), Event(0, "pivot"))
    # Leave room for two checkpoints before the first fault and a few after the last.
    low = 2 * plan.save_every + 10
    high = plan.steps - max(60, plan.save_every + 10)
    slot = (high - low) / len(kinds)
    for i, event in enumerate(kinds):
        jitter = rng.uniform(0.1, 0.6) * slot
        event.step = int(low + i * slot + jitter)
    nan_step = next(e.step for e in kinds if e.kind == "nan")
    hang_step = next(e.step for e in kinds if e.kind == "hang")
    return kinds, nan_step, hang_step


def trainer_command(plan: SoakPlan, *extra: str, script: Path | None = None) -> list[str]:
    """The soak's trainer command: the plan's trainer, behind the wrapper if the plan says
    so (the reference trainer's module passed by name, so the wrapper's command line is not
    a trainer's)."""
    command = plain_trainer_argv(plan, *extra, script=script)
    if plan.wrapper is None:
        return command
    if plan.trainer == "scripted":
        return [PYTHON, str(WRAPPER), *plan.wrapper, "--", *command]
    assert command[: len(REFERENCE_TRAINER)] == REFERENCE_TRAINER
    module, args = REFERENCE_TRAINER[-1], command[len(REFERENCE_TRAINER) :]
    return [PYTHON, str(WRAPPER), *plan.wrapper, "--python-module", module, "--", *args]


# ----------------------------------------------------------------------------- records


@dataclass
class Fault:
    kind: str
    t: float
    step: int | None
    detail: dict[str, Any] = field(default_factory=dict)
    reaction: dict[str, Any] = field(default_factory=dict)
    latency_s: float | None = None
    survived: bool = False
    problem: str | None = None


@dataclass
class CommandResult:
    client: str
    cmd: str
    t0: float
    t1: float
    outcome: str
    """"ok", a refusal code, or "transport: ..." when the connection failed."""
    result: Any = None


class JournalTail:
    """Reads .trainwarden/journal.jsonl incrementally (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.records: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.records
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if isinstance(record, dict):
                    self.records.append(record)
        return self.records

    def find(self, kind: str, after: float, **match: Any) -> dict[str, Any] | None:
        for record in self.read():
            if record.get("kind") != kind or record.get("t", 0) < after:
                continue
            if all(record.get(k) == v for k, v in match.items()):
                return record
        return None


def verify_bytes(path: Path) -> bool:
    """andrea-bin verification as the watcher does it, for the test's own choices."""
    match = CKPT_NAME.match(path.name)
    try:
        if path.is_symlink() or not path.is_file() or match is None:
            return False
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
        size = path.stat().st_size
    except OSError:
        return False
    if len(head) < HEADER.size:
        return False
    step, n_params = HEADER.unpack(head)
    return n_params > 0 and step == int(match.group(1)) and size == 8 + 12 * n_params


def doubled_weights(data: bytes, rng: random.Random) -> bytes:
    """`data` (an andrea-bin file) with DOUBLED_WEIGHTS consecutive weights doubled: the
    same size and header, every value still finite, so only a digest can tell."""
    n_params = HEADER.unpack_from(data)[1]
    count = min(DOUBLED_WEIGHTS, n_params)
    first = rng.randrange(n_params - count + 1)
    start = HEADER.size + 4 * first
    weights = struct.unpack_from(f"<{count}f", data, start)
    # A zero doubles to itself and a huge value to infinity: those change another way.
    changed = [w * 2.0 if 0.0 < abs(w) < 1e30 else (w / 2.0 if w else 1.0) for w in weights]
    out = bytearray(data)
    struct.pack_into(f"<{count}f", out, start, *changed)
    return bytes(out)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (p99 of a few values is their maximum); None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


# ----------------------------------------------------------------------------- reference runs


class StraightRun:
    """`python -m trainwarden.trainer` alone, never interrupted: the bit-exact reference (runs in the
    background from the moment it is asked for, on the other core)."""

    def __init__(self, run_dir: Path, plan: SoakPlan) -> None:
        self.run_dir = run_dir
        self.steps = plan.steps
        run_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = run_dir / "stdout.txt"
        with open(self.stdout_path, "wb") as out:
            self.proc = subprocess.Popen(
                plain_trainer_argv(plan),
                cwd=run_dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self, timeout: float) -> None:
        code = self.proc.wait(timeout)
        assert code == 0, f"straight run failed ({code}): {self.stdout_path.read_text()[-2000:]}"

    def losses(self) -> dict[int, float]:
        return step_losses(self.stdout_path.read_text())

    def final_bytes(self) -> bytes:
        return (self.run_dir / "checkpoints" / f"step_{self.steps:06d}.bin").read_bytes()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def step_losses(text: str) -> dict[int, float]:
    losses: dict[int, float] = {}
    for line in text.splitlines():
        match = STEP_LINE.match(line)
        if match:
            losses[int(match.group(1))] = float(match.group(2))
    return losses


# ----------------------------------------------------------------------------- the soak


class Soak:
    def __init__(self, plan: SoakPlan, base: Path, *, use_namespace: bool) -> None:
        self.plan = plan
        self.base = base
        self.run_dir = (base / "run").resolve()
        self.rng = random.Random(plan.seed * 7919 + 1)
        self.schedule, self.nan_step, self.hang_step = make_schedule(plan)
        self.use_namespace = use_namespace
        self.namespace_reason = ""
        self.holder: subprocess.Popen[bytes] | None = None
        self.stderr_path = base / "daemon.stderr"
        self.daemon = DaemonProcess(self.run_dir, stderr_path=self.stderr_path)
        """Started inside the holder's mount namespace once there is one (start_namespace)."""
        self.daemon_exits: list[dict[str, Any]] = []
        self.watcher: subprocess.Popen[bytes] | None = None
        self.watch_out = base / "watcher.jsonl"
        self.journal = JournalTail(self.run_dir / ".trainwarden" / "journal.jsonl")
        self.faults: list[Fault] = []
        self.commands: list[CommandResult] = []
        self.downtimes: list[list[float]] = []
        self.notes: list[str] = []
        self.skipped: list[str] = []
        self.hang_done = False
        """The daemon's reaction to the trainer's built-in hang has been seen."""
        self.pivot_result: dict[str, Any] | None = None
        self.script: Path | None = None
        """The trainer's script the broken_script fault breaks (scripted soaks only)."""
        self.left_after_exit: list[dict[str, Any]] | None = None
        """The run's marked processes alive once the daemon had exited after its shutdown."""
        self.left_later: list[dict[str, Any]] | None = None
        self.halts: list[dict[str, Any]] = []
        self.started_t = 0.0
        self.finished_t = 0.0

    # ------------------------------------------------------------------ set-up

    @property
    def ckpt(self) -> Path:
        """The checkpoint directory as the daemon sees it (inside its mount namespace)."""
        if self.holder is not None:
            return Path(f"/proc/{self.holder.pid}/root") / str(self.run_dir / "checkpoints")[1:]
        return self.run_dir / "checkpoints"

    @property
    def socket(self) -> Path:
        return self.daemon.socket

    def write_config(self) -> None:
        plan = self.plan
        faults = fault_args(plan, self.nan_step, self.hang_step)
        script = None
        if plan.script_breaks:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            script = self.run_dir / SCRIPTED_TRAINER.name
            shutil.copy(SCRIPTED_TRAINER, script)
        self.script = script
        reference_run(
            self.run_dir,
            plan.steps,
            plan.save_every,
            *faults,
            trainer={
                "command": trainer_command(plan, *faults, script=script),
                "env": {"TRAINER_TEST_SLOW_SAVE_S": str(plan.slow_save_s)},
                "stop_timeout_s": plan.stop_timeout_s,
                "signal_target": plan.signal_target,
            },
            restart={
                "stall_timeout_s": plan.stall_timeout_s,
                "max_restarts_without_progress": 10,
            },
            checkpoints={"keep_last": plan.keep_last},
        )
        # The trainer's seed is part of its argv (trainer_argv's default); keep it explicit.
        assert plan.train_seed == 1337

    def start_namespace(self) -> None:
        """A holder process owns a private mount namespace with a tmpfs on checkpoints/."""
        if not self.use_namespace:
            return
        (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            self.namespace_reason = "not root: cannot mount a tmpfs for the ENOSPC fault"
            self.use_namespace = False
            return
        script = f'mount -t tmpfs -o size={TMPFS_SIZE} tmpfs "$1" && exec sleep 1000000'
        holder = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
                str(self.run_dir / "checkpoints"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

        def mounted() -> bool:
            if holder.poll() is not None:
                return True
            with contextlib.suppress(OSError):
                info = Path(f"/proc/{holder.pid}/mountinfo").read_text()
                return f" {self.run_dir / 'checkpoints'} " in info and "tmpfs" in info
            return False

        try:
            wait_for(mounted, 10, 0.02, what="the tmpfs in the private namespace")
        except AssertionError:
            pass
        if holder.poll() is not None or not mounted():
            err = holder.stderr.read().decode(errors="replace").strip() if holder.stderr else ""
            with contextlib.suppress(ProcessLookupError):
                os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(10)
            self.namespace_reason = f"unshare/mount failed: {err or 'no tmpfs appeared'}"
            self.use_namespace = False
            return
        self.holder = holder
        self.daemon.wrap = ["nsenter", "-t", str(holder.pid), "-m", "--"]

    def start_watcher(self) -> None:
        threshold = self.plan.keep_last + 1
        self.watcher = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "tests.chaos.watcher",
                "--checkpoints",
                str(self.ckpt),
                "--run-dir",
                str(self.run_dir),
                "--out",
                str(self.watch_out),
                "--threshold",
                str(threshold),
            ],
            cwd=REPO,
            start_new_session=True,
        )

    def launch_daemon(self) -> None:
        self.daemon.start(wait=False)

    def wait_answering(self, timeout: float = 60.0) -> None:
        self.daemon.wait_ready(timeout)

    def kill_daemon(self, why: str) -> None:
        if self.daemon.proc is None:
            return
        code = self.daemon.kill()
        self.daemon_exits.append({"pid": self.daemon.pid, "code": code, "cause": why})

    def stderr_tail(self) -> str:
        return self.daemon.stderr(3000)

    # ------------------------------------------------------------------ talking to it

    def request(self, cmd: str, timeout: float = 10.0, **args: Any) -> Any:
        """The result, or None when no daemon answers right now."""
        return self.daemon.ask(cmd, timeout, **args)

    def status(self) -> dict[str, Any] | None:
        return self.request("status")

    def ensure_daemon(self) -> None:
        """A daemon that died without the test killing it is a violation; restart it as
        systemd would so the soak can go on and report the rest."""
        if self.daemon.proc is not None and not self.daemon.alive:
            code = self.daemon.proc.returncode
            self.daemon_exits.append({"pid": self.daemon.pid, "code": code, "cause": "on its own"})
            self.notes.append(
                f"daemon exited on its own ({code}); restarted: {self.stderr_tail()[-500:]}"
            )
            self.launch_daemon()
            self.wait_answering()

    def unexpected_halt(self, status: dict[str, Any]) -> None:
        """The run halted without the test asking for it: a violation. Start it again (as an
        operator would) so the soak can go on and report everything else."""
        self.halts.append({"t": time.time(), "state": status["state"], **status.get("detail", {})})
        if len(self.halts) > 5:
            raise AssertionError(f"the run keeps halting: {self.halts}")
        self.request("start")

    def wait_running(self, timeout: float = 120.0, not_pid: int | None = None) -> dict[str, Any]:
        """Status once the trainer runs (logged a step), or the run has finished."""

        def ready() -> dict[str, Any] | None:
            self.ensure_daemon()
            s = self.status()
            if s is None:
                return None
            if s["state"] == "finished":
                return s
            if s["state"] in ("stopped", "crash_loop", "diverged"):
                self.unexpected_halt(s)
                return None
            if s["state"] == "running" and s.get("trainer_pid") and s["trainer_pid"] != not_pid:
                return s
            return None

        return wait_for(ready, timeout, 0.1, what="a running trainer")

    def advance_to(self, step: int, timeout: float) -> dict[str, Any] | None:
        """Status once the run has logged `step`; None if it finished first."""

        def reached() -> dict[str, Any] | None:
            self.ensure_daemon()
            s = self.status()
            if s is None:
                return None
            if s["state"] == "finished":
                return s
            if s["state"] in ("stopped", "crash_loop", "diverged"):
                self.unexpected_halt(s)
                return None
            if s["state"] == "running" and (s.get("step") or 0) >= step:
                return s
            return None

        s = wait_for(reached, timeout, 0.05, what=f"step {step}")
        return None if s["state"] == "finished" else s

    # ------------------------------------------------------------------ checkpoint files

    def committed(self) -> list[Path]:
        try:
            names = [n for n in os.listdir(self.ckpt) if CKPT_NAME.match(n)]
        except OSError:
            return []
        return sorted((self.ckpt / n for n in names), key=lambda p: int(p.name[5:-4]))

    def verified(self) -> list[Path]:
        return [p for p in self.committed() if verify_bytes(p)]

    def fresh_tmp(self, seen: dict[str, int]) -> Path | None:
        """A .bin.tmp write that was not there (with this mtime) when `seen` was taken."""
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.ckpt):
                if entry.name.endswith(".bin.tmp"):
                    with contextlib.suppress(OSError):
                        if seen.get(entry.name) != entry.stat().st_mtime_ns:
                            return Path(entry.path)
        return None

    def tmp_snapshot(self) -> dict[str, int]:
        seen = {}
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.ckpt):
                if entry.name.endswith(".bin.tmp"):
                    with contextlib.suppress(OSError):
                        seen[entry.name] = entry.stat().st_mtime_ns
        return seen

    # ------------------------------------------------------------------ the run

    def run(self) -> None:
        self.write_config()
        self.start_namespace()
        self.start_watcher()
        self.started_t = time.time()
        self.launch_daemon()
        self.wait_answering()
        step_budget = self.plan.steps / 10.0 + 120.0
        for event in self.schedule:
            if event.kind == "hang" and self.hang_done:
                continue
            if event.kind in ("nan", "hang"):
                if not self.await_builtin(event):
                    break
                continue
            status = self.advance_to(event.step, step_budget)
            if status is None:
                self.skipped.append(f"{event.kind}@{event.step}: the run finished first")
                continue
            if self.hanging(status):
                # Run late, this fault would land on the hung trainer and pre-empt the
                # daemon's reaction to the hang: that reaction first.
                if not self.settle_hang():
                    break
                status = self.wait_running()
                if status["state"] == "finished":
                    break
            getattr(self, f"do_{event.kind}")(event, status)

        def finished() -> dict[str, Any] | None:
            self.ensure_daemon()
            s = self.status()
            if s is not None and s["state"] in ("stopped", "crash_loop", "diverged"):
                self.unexpected_halt(s)
                return None
            return s if s is not None and s["state"] == "finished" else None

        final = wait_for(finished, step_budget + 300, 0.2, what="the run to finish")
        self.finished_t = time.time()
        self.final_status = final
        self.final_checkpoints = self.request("checkpoints")
        reply = self.request("shutdown", timeout=60.0)
        assert reply is not None, "shutdown got no answer"
        code = self.daemon.wait_exit(60)
        self.daemon_exits.append({"pid": self.daemon.pid, "code": code, "cause": "shutdown"})
        self.left_after_exit = run_processes(str(self.run_dir))
        if self.left_after_exit:
            time.sleep(2.0)
            self.left_later = run_processes(str(self.run_dir))

    def stop_watcher(self) -> None:
        if self.watcher is not None and self.watcher.poll() is None:
            self.watcher.send_signal(signal.SIGTERM)
            try:
                self.watcher.wait(10)
            except subprocess.TimeoutExpired:
                self.watcher.kill()
                self.watcher.wait(10)

    def cleanup(self) -> None:
        """Kill what is left, by pid: trainers of this run, the daemon, watcher, holder."""
        if self.daemon.alive:
            self.kill_daemon("cleanup")
        pids = {r.get("pid") for r in self.journal.read() if r.get("kind") == "trainer_started"}
        for pid in pids:
            if isinstance(pid, int) and self.is_trainer(pid):
                kill_quietly(pid)
        # Whatever else carries one of this run's start markers (a wrapper's helper).
        for proc in run_processes(str(self.run_dir)):
            kill_quietly(int(proc["pid"]), group=False)
        self.stop_watcher()
        if self.holder is not None and self.holder.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.holder.pid, signal.SIGKILL)
            self.holder.wait(10)

    # ------------------------------------------------------------------ faults

    def record(self, kind: str, step: int | None, **detail: Any) -> Fault:
        fault = Fault(kind, time.time(), step, detail)
        self.faults.append(fault)
        return fault

    def is_trainer(self, pid: int) -> bool:
        """`pid` is this run's trainer main process: the trainer, or the wrapper where it
        stays the main process."""
        if belongs_to_run(pid, self.run_dir) and runs_a_trainer(argv_of(pid)):
            return True
        return (
            self.plan.wrapper is not None
            and "--stay" in self.plan.wrapper
            and belongs_to_run(pid, self.run_dir)
            and str(WRAPPER).encode() in argv_of(pid)
        )

    def kill_trainer(self, pid: int, kind: str, step: int | None, **detail: Any) -> Fault | None:
        if self.hanging(self.status()):
            self.settle_hang()
            self.notes.append(f"{kind}: the trainer had hung; the hang's reaction came first")
            return None
        if not self.is_trainer(pid):
            self.notes.append(f"{kind}: pid {pid} was no longer our trainer; not killed")
            return None
        fault = self.record(kind, step, pid=pid, **detail)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            self.faults.remove(fault)
            return None
        fault.t = time.time()
        return fault

    def await_restart(self, pid: int, timeout: float = 120.0) -> None:
        self.wait_running(timeout, not_pid=pid)

    def do_trainer_kill(self, event: Event, status: dict[str, Any]) -> None:
        time.sleep(self.rng.uniform(0.0, 1.5))
        status = self.wait_running()
        if status["state"] == "finished":
            return
        pid = status["trainer_pid"]
        if self.kill_trainer(pid, "trainer_kill", status.get("step")):
            self.await_restart(pid)

    def do_trainer_kill_in_write(self, event: Event, status: dict[str, Any]) -> None:
        pid = status["trainer_pid"]
        seen = self.tmp_snapshot()
        deadline = time.monotonic() + 60
        tmp = None
        while time.monotonic() < deadline and tmp is None:
            tmp = self.fresh_tmp(seen)
            if tmp is None:
                time.sleep(0.002)
        if tmp is None:
            self.notes.append("trainer_kill_in_write: no checkpoint write seen in 60 s")
            return
        fault = self.kill_trainer(pid, "trainer_kill_in_write", None, tmp=tmp.name)
        if fault is None:
            return
        # Landed mid-write when the .tmp is still there and never became a committed file.
        time.sleep(0.05)
        final = tmp.with_name(tmp.name[: -len(".tmp")])
        fault.detail["landed_in_write"] = tmp.exists() and not final.exists()
        self.await_restart(pid)

    def plant(self, how: str) -> dict[str, Any] | None:
        """Corrupt the newest verified checkpoint in place (while the daemon is down)."""
        good = self.verified()
        if how == "double_weights":
            # Only a change to a file whose digest the killed daemon persisted can be seen.
            digested = self.persisted_digests()
            good = [p for p in good if p.name in digested]
        if len(good) < 2:
            self.notes.append(f"plant {how}: fewer than two verified checkpoints; skipped")
            return None
        target = good[-1]
        data = bytearray(target.read_bytes())
        if how == "truncate":
            data = data[: len(data) // 2]
        elif how == "flip_step":
            data[0] ^= 1 << self.rng.randrange(8)
        elif how == "flip_n_params":
            data[4 + self.rng.randrange(4)] ^= 1 << self.rng.randrange(8)
        elif how == "nan_weight":
            n_params = HEADER.unpack_from(data)[1]
            offset = HEADER.size + 4 * self.rng.randrange(n_params)
            data[offset : offset + 4] = struct.pack("<f", math.nan)
        else:
            data = bytearray(doubled_weights(bytes(data), self.rng))
        with open(target, "r+b") as f:
            f.write(data)
            f.truncate(len(data))
            f.flush()
            os.fsync(f.fileno())
        return {"name": target.name, "how": how}

    def persisted_digests(self) -> dict[str, str]:
        """The per-name digests in the daemon's newest `state` journal record."""
        for record in reversed(self.journal.read()):
            if record.get("kind") == "state":
                digests = (record.get("state") or {}).get("digests") or {}
                return dict(digests) if isinstance(digests, dict) else {}
        return {}

    def plant_future(self, while_: str) -> Fault | None:
        """A copy of the newest verified checkpoint renamed into place as a far-future
        step, its header patched to match: it passes andrea-bin verification."""
        good = self.verified()
        if not good:
            self.notes.append(f"plant_future ({while_}): no verified checkpoint to copy")
            return None
        step = FUTURE_STEP - sum(1 for f in self.faults if f.kind == "plant_future")
        name = checkpoint_name(step)
        try:
            data = bytearray(good[-1].read_bytes())
        except FileNotFoundError:
            self.notes.append(f"plant_future ({while_}): {good[-1].name} vanished; skipped")
            return None
        HEADER.pack_into(data, 0, step, HEADER.unpack_from(data)[1])
        staging = self.ckpt / "planted.partial"
        with open(staging, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # The fault's time is the rename's start: the daemon may react before it returns.
        fault = self.record("plant_future", None, name=name, copy_of=good[-1].name, during=while_)
        os.replace(staging, self.ckpt / name)
        return fault

    def do_plant_future(self, event: Event, status: dict[str, Any]) -> None:
        fault = self.plant_future("running")
        if fault is not None:
            self.await_quarantine(fault)

    def daemon_verified(self) -> list[Path]:
        """Committed checkpoints the running daemon has journaled as verified (its
        `checkpoint` record: it holds their digest) and not deleted or quarantined since,
        oldest first."""
        live: dict[str, float] = {}
        for record in self.journal.read():
            kind, name = record.get("kind"), record.get("name")
            if kind == "checkpoint":
                live[name] = record["t"]
            elif kind in ("delete", "quarantine"):
                live.pop(name, None)
        return [p for p in self.verified() if p.name in live]

    def do_corrupt_committed(self, event: Event, status: dict[str, Any]) -> None:
        spawned = [r for r in self.journal.read() if r.get("kind") == "spawn"]
        resumed = ((spawned[-1].get("resume") or {}) if spawned else {}).get("name")
        pinned = (self.pivot_result or {}).get("step")
        # Not the file the live trainer may still be loading, nor the pivot's pinned one
        # (the continuation reference is copied from it); one of the two newest, so that
        # retention cannot delete it while it is rewritten.

        # Nor the run's last checkpoint: the final weights are judged against the reference.
        spared = {resumed, checkpoint_name(self.plan.steps)}
        if pinned is not None:
            spared.add(checkpoint_name(pinned))

        def choices() -> list[Path]:
            journaled = [p for p in self.daemon_verified() if p.name not in spared][-2:]
            if journaled:
                return journaled
            # Committed while no daemon ran (the trainer went on) and digested by the next
            # daemon's start-up scan, which journals no `checkpoint` record for them.
            return [p for p in self.verified() if p.name not in spared][-2:]

        # Right after a pivot or a rollback the only ones may be those two: the next commit.
        with contextlib.suppress(AssertionError):
            wait_for(choices, 30, 0.1, what="a checkpoint to corrupt")
        candidates = choices()
        if not candidates:
            self.notes.append(f"corrupt_committed@{event.step}: no daemon-verified checkpoint")
            return
        target = self.rng.choice(candidates)
        try:
            with open(target, "r+b") as f:
                original = f.read()
                changed = doubled_weights(original, self.rng)
                # From the first write: the daemon may see it before the fsync returns.
                fault = self.record("corrupt_committed", status.get("step"), name=target.name)
                f.seek(0)
                f.write(changed)
                f.flush()
                os.fsync(f.fileno())
        except FileNotFoundError:
            self.notes.append(f"corrupt_committed@{event.step}: {target.name} vanished; skipped")
            return
        fault.detail["bytes_changed"] = sum(a != b for a, b in zip(original, changed, strict=True))
        self.await_quarantine(fault)

    def await_quarantine(self, fault: Fault) -> None:
        """Let the daemon react before the next fault (its reaction is judged later)."""
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: self.journal.find("quarantine", fault.t - 1, name=fault.detail["name"]),
                30,
                0.05,
                what=f"the quarantine of {fault.detail['name']}",
            )

    def do_daemon_kill(self, event: Event, status: dict[str, Any]) -> None:
        time.sleep(self.rng.uniform(0.0, 1.0))
        down = [time.time(), math.inf]
        self.downtimes.append(down)
        double = event.args["double"]
        fault = self.record("daemon_kill", status.get("step"), double=double)
        self.kill_daemon("test: SIGKILL")
        fault.t = time.time()
        plants = list(event.args["plants"])
        planted = self.plant(plants.pop(0))
        if planted is not None:
            self.record(f"plant_{planted['how']}", None, name=planted["name"])
        if event.args["future"]:
            self.plant_future("down")
        if double:
            self.launch_daemon()
            time.sleep(self.rng.uniform(0.05, 0.8))
            self.kill_daemon("test: SIGKILL (second, in quick succession)")
            # Down again: corrupt the (new) newest one too, the next way round.
            again = self.plant(plants.pop(0))
            if again is not None:
                self.record(f"plant_{again['how']}", None, name=again["name"])
        fault.detail["relaunch_t"] = time.time()
        self.launch_daemon()
        self.wait_answering()
        spawned = wait_for(
            lambda: self.journal.find("spawn", fault.detail["relaunch_t"]),
            120,
            0.05,
            what="a spawn after the daemon restart",
        )
        down[1] = spawned["t"] + 0.5
        self.wait_running()

    def do_enospc(self, event: Event, status: dict[str, Any]) -> None:
        if self.holder is None:
            self.skipped.append(f"enospc@{event.step}: {self.namespace_reason}")
            return
        good = self.verified()
        size = good[-1].stat().st_size if good else 1_500_000
        stats = os.statvfs(self.ckpt)
        free = stats.f_bavail * stats.f_frsize
        # Leave half a checkpoint: the sidecar fits, the .bin write fails part-way.
        ballast = self.ckpt / "ballast.fill"
        fill = max(0, free - size // 2)
        with open(ballast, "wb") as f:
            chunk = b"\0" * (1 << 20)
            left = fill
            with contextlib.suppress(OSError):
                while left > 0:
                    left -= f.write(chunk[: min(len(chunk), left)])
                f.flush()
        fault = self.record("enospc", status.get("step"), free_before=free, ballast=fill)
        crash = None
        deadline = time.monotonic() + 120
        with open(ballast, "ab") as f:
            while time.monotonic() < deadline:
                crash = self.journal.find("crash", fault.t)
                if crash is not None:
                    break
                # A save already written when the disk was filled commits, and retention
                # then deletes an older checkpoint: fill what that frees again, or the next
                # save fits and the disk never fills for the trainer.
                stats = os.statvfs(self.ckpt)
                more = stats.f_bavail * stats.f_frsize - size // 2
                with contextlib.suppress(OSError):
                    while more > 0:
                        more -= f.write(b"\0" * min(1 << 20, more))
                    f.flush()
                time.sleep(0.02)
        ballast.unlink()
        fault.detail["cleared_t"] = time.time()
        if crash is None:
            fault.problem = "no crash within 120 s of the disk filling up"
            return
        wait_for(
            lambda: self.journal.find("checkpoint", fault.detail["cleared_t"]),
            120,
            0.1,
            what="a checkpoint after the disk was cleared",
        )
        self.wait_running()

    # ------------------------------------------------------------------ two clients

    def two_clients(self, a: Any, b: Any) -> None:
        """Run a(client) and b(client) in two threads that start at the same moment."""
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def body(name: str, script: Any) -> None:
            try:
                with Client(self.socket, timeout=120.0) as client:
                    barrier.wait(10)
                    script(name, client)
            except BaseException as exc:  # reported by the caller
                errors.append(exc)

        threads = [
            threading.Thread(target=body, args=("A", a)),
            threading.Thread(target=body, args=("B", b)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        if errors:
            self.notes.append(f"client thread error: {errors[0]!r}")

    def send(self, name: str, client: Client, cmd: str, **args: Any) -> CommandResult:
        t0 = time.time()
        try:
            result = client.request(cmd, **args)
            outcome = "ok"
        except CommandRefused as exc:
            result, outcome = str(exc), exc.code
        except (ProtocolError, OSError) as exc:
            result, outcome = None, f"transport: {exc}"
        entry = CommandResult(name, cmd, t0, time.time(), outcome, result)
        self.commands.append(entry)
        return entry

    def until_ok(
        self,
        name: str,
        client: Client,
        cmd: str,
        deadline_s: float = 90.0,
        retry: tuple[str, ...] = ("busy", "wrong_state"),
        **args: Any,
    ) -> CommandResult:
        """Send cmd until it succeeds, while the refusal is one of `retry` (another client
        holds the operator lock, or the run is between states)."""
        end = time.monotonic() + deadline_s
        while True:
            entry = self.send(name, client, cmd, **args)
            if entry.outcome not in retry or time.monotonic() > end:
                return entry
            time.sleep(0.05)

    def do_broken_script(self, event: Event, status: dict[str, Any]) -> None:
        """train.py broken under a running trainer, which then dies: the next starts fail
        before they can read a checkpoint. Repaired once the run has halted in crash_loop
        (or after a few failed starts), then started again."""
        assert self.script is not None
        good = self.script.read_bytes()
        pid = status["trainer_pid"]
        self.script.write_text(BROKEN_SCRIPT)
        fault = self.kill_trainer(pid, "broken_script", status.get("step"))
        if fault is None:
            self.script.write_bytes(good)
            return

        def failed_enough() -> bool:
            s = self.status()
            failures = [
                r for r in self.journal.read()
                if r.get("kind") == "crash" and r.get("t", 0) >= fault.t
                and "SyntaxError" in str(r.get("last_line"))
            ]  # fmt: skip
            return (s is not None and s["state"] == "crash_loop") or len(failures) >= 2

        wait_for(failed_enough, 60, 0.05, what="starts failing on the broken script")
        self.script.write_bytes(good)
        fault.detail["repaired_t"] = time.time()
        s = self.status()
        if s is not None and s["state"] == "crash_loop":
            fault.detail["halted"] = True
            self.request("start")
        self.wait_running()

    def do_save_pair(self, event: Event, status: dict[str, Any]) -> None:
        def both(name: str, client: Client) -> None:
            self.send(name, client, "save", wait=True)
            self.send(name, client, "status")

        self.two_clients(both, both)

    def do_stop_start(self, event: Event, status: dict[str, Any]) -> None:
        def operator(name: str, client: Client) -> None:
            self.until_ok(name, client, "stop")
            self.until_ok(name, client, "start")

        def saver(name: str, client: Client) -> None:
            self.send(name, client, "save", wait=True)
            self.send(name, client, "checkpoints")

        self.two_clients(operator, saver)
        s = self.status()
        if s is not None and s["state"] == "stopped":
            self.notes.append("stop_start: the operator's start did not get through; started again")
            self.request("start")
        self.wait_running()

    def do_save_kill(self, event: Event, status: dict[str, Any]) -> None:
        pid = status["trainer_pid"]

        def saver(name: str, client: Client) -> None:
            self.send(name, client, "save", wait=True)

        def killer(name: str, client: Client) -> None:
            time.sleep(self.rng.uniform(0.0, 0.3))
            self.kill_trainer(pid, "trainer_kill", None, during="save --wait")
            self.send(name, client, "status")

        self.two_clients(saver, killer)
        self.await_restart(pid)

    def do_pivot(self, event: Event, status: dict[str, Any]) -> None:
        wait_for(lambda: (self.run_dir / ".state.json").exists(), 60, what=".state.json")

        def pivoter(name: str, client: Client) -> None:
            # Retries while the other client holds the operator lock; gives up (and the
            # main thread retries alone) if the other's stop got in first.
            entry = self.until_ok(name, client, "pivot", 10.0, ("busy",), **NEW_POLICY)
            if entry.outcome == "ok":
                self.pivot_result = {**entry.result, "t": entry.t1}

        def other(name: str, client: Client) -> None:
            self.send(name, client, "save", wait=True)
            self.send(name, client, "stop")

        self.two_clients(pivoter, other)
        s = self.status()
        if s is not None and s["state"] == "stopped":
            self.request("start")
        self.wait_running()
        if self.pivot_result is None:
            with Client(self.socket, timeout=120.0) as client:
                entry = self.until_ok("A", client, "pivot", 60.0, **NEW_POLICY)
            if entry.outcome == "ok":
                self.pivot_result = {**entry.result, "t": entry.t1}
            self.wait_running()

    def hanging(self, status: dict[str, Any] | None) -> bool:
        """The trainer has reached its built-in hang and the daemon has not reacted yet."""
        if self.hang_done or status is None or (status.get("step") or 0) < self.hang_step:
            return False
        if self.journal.find("stall", self.started_t) is not None:
            self.hang_done = True
            return False
        return True

    def settle_hang(self) -> bool:
        """Wait for the daemon's reaction to the hang (see await_builtin)."""
        hang = next(e for e in self.schedule if e.kind == "hang")
        self.hang_done = self.await_builtin(hang)
        return self.hang_done

    def await_builtin(self, event: Event) -> bool:
        """NaN and hang fire inside the trainer at their step: wait for the reaction."""
        kind = "divergence" if event.kind == "nan" else "stall"
        budget = self.plan.steps / 10.0 + 120.0 + self.plan.stall_timeout_s
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            self.ensure_daemon()
            if self.journal.find(kind, self.started_t) is not None:
                self.wait_running()
                return True
            s = self.status()
            if s is not None and s["state"] == "finished":
                self.skipped.append(f"{event.kind}@{event.step}: the run finished first")
                return False
            time.sleep(0.1)
        raise AssertionError(
            f"no {kind} record within {budget:.0f} s of waiting for step {event.step}"
        )


def continuation_from_pivot(soak: Soak, base: Path) -> StraightRun:
    """The pivot's reference: the pinned pivot checkpoint, the new policy.json, and the
    trainer alone from there with a fresh bandit, as the daemon starts it."""
    assert soak.pivot_result is not None
    step = soak.pivot_result["step"]
    run_dir = base / "continuation"
    (run_dir / "checkpoints").mkdir(parents=True)
    for suffix in (".bin", ".json"):
        shutil.copy(soak.ckpt / f"step_{step:06d}{suffix}", run_dir / "checkpoints")
    shutil.copy(soak.run_dir / "policy.json", run_dir / "policy.json")
    resume = run_dir / "checkpoints" / f"step_{step:06d}.bin"
    plan = soak.plan
    run = StraightRun.__new__(StraightRun)
    run.run_dir, run.steps = run_dir, plan.steps
    run.stdout_path = run_dir / "stdout.txt"
    if plan.trainer == "scripted":
        # As the daemon starts it after a pivot: the checkpoint and TRAINWARDEN_PIVOT.
        argv = plain_trainer_argv(plan)
        env = {**os.environ, "TRAINWARDEN_RESUME": str(resume), "TRAINWARDEN_PIVOT": "1"}
    else:
        argv = [*plain_trainer_argv(plan), "--resume", str(resume), "--fresh-bandit"]
        env = None
    with open(run.stdout_path, "wb") as out:
        run.proc = subprocess.Popen(
            argv,
            cwd=run_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return run
