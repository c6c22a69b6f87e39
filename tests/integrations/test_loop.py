"""trainwarden.integrations.loop: the helpers on their own, then a nanoGPT-style loop
(tests/integrations/nanogpt_loop.py) using them under the real daemon: save, stop, SIGKILLs
(one in the middle of a save) and a daemon SIGKILL, all ending where an uninterrupted run
ends, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    PYTHON,
    REPO,
    DaemonProcess,
    belongs_to_run,
    journal,
    kill_quietly,
    make_run,
    pid_alive,
    running_daemon,
    wait_for,
)

torch = pytest.importorskip("torch")

from trainwarden.integrations import loop  # noqa: E402
from trainwarden.integrations.loop import Signals, atomic_torch_save, resume_path  # noqa: E402

pytestmark = pytest.mark.timeout(600)

LOOP = Path(__file__).resolve().parent / "nanogpt_loop.py"
ENV = {"PYTHONPATH": str(REPO)}


# ----------------------------------------------------------------------------- Signals


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    """Whatever a test installs for SIGUSR1/SIGTERM is undone after it."""
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def caught_signals() -> set[int]:
    """The signals this process catches, from the kernel's SigCgt mask (what the daemon reads)."""
    status = Path("/proc/self/status").read_text()
    mask = int(
        next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt")), 16
    )
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def test_outside_the_daemon_no_handler_is_installed_and_no_flag_rises(
    monkeypatch, restored_handlers
):
    monkeypatch.delenv("TRAINWARDEN_RUN_DIR", raising=False)
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    signals = Signals()
    assert not signals.installed
    assert {s: signal.getsignal(s) for s in before} == before
    assert not signals.save_requested and not signals.stop_requested
    assert Signals(sync=True).save_requested is False  # no collective outside the daemon


def test_under_the_daemon_the_handlers_only_raise_flags(monkeypatch, tmp_path, restored_handlers):
    monkeypatch.setenv("TRAINWARDEN_RUN_DIR", str(tmp_path))
    signals = Signals()
    # Installed by the constructor, before any iteration: the daemon's SigCgt check passes.
    assert {signal.SIGUSR1, signal.SIGTERM} <= caught_signals()
    assert not signals.save_requested

    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert signals.save_requested
    assert signals.save_requested, "a read does not consume the request"
    assert not signals.stop_requested
    signals.saved()
    assert not signals.save_requested, "two requests before one read ask for one save"

    assert not signals.save_requested
    os.kill(os.getpid(), signal.SIGUSR1)  # arrives after the read that decides to save...
    signals.saved()
    assert signals.save_requested, "...so it asks for another save"
    signals.saved()
    assert not signals.save_requested

    os.kill(os.getpid(), signal.SIGTERM)
    assert signals.stop_requested
    signals.saved()
    assert signals.stop_requested, "a stop stays requested"


def test_resume_path_is_the_daemons_choice_or_none(monkeypatch):
    monkeypatch.delenv("TRAINWARDEN_RESUME", raising=False)
    assert resume_path() is None
    monkeypatch.setenv("TRAINWARDEN_RESUME", "")
    assert resume_path() is None
    monkeypatch.setenv("TRAINWARDEN_RESUME", "/run/checkpoints/ckpt_000100.pt")
    assert resume_path() == "/run/checkpoints/ckpt_000100.pt"


# ----------------------------------------------------------------------------- atomic_torch_save

SAVE_UNDER_FIRE = textwrap.dedent(
    """
    import json, os, random, signal, sys, time
    import torch
    from trainwarden.integrations.loop import atomic_torch_save

    path, kills = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    random.seed(7)

    def version(v):
        return {"v": v, "w": torch.full((1 << 20,), float(v))}

    atomic_torch_save(version(0), path)
    outcomes = []
    for k in range(kills):
        first = 1 + 1000 * k
        pid = os.fork()
        if pid == 0:  # saves new versions until killed
            v = first
            while True:
                atomic_torch_save(version(v), path)
                v += 1
        time.sleep(random.uniform(0.0, 0.3))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        in_flight = os.path.exists(path + ".tmp")
        try:
            obj = torch.load(path, weights_only=True)
            whole = bool((obj["w"] == float(obj["v"])).all())
            outcomes.append({"v": obj["v"], "whole": whole, "in_flight": in_flight})
        except Exception as exc:
            outcomes.append({"error": str(exc)[:200], "in_flight": in_flight})
    print(json.dumps(outcomes))
    """
)


def test_a_save_killed_at_any_moment_leaves_the_old_file_or_the_new_one(tmp_path: Path):
    path = tmp_path / "ckpt_000001.pt"
    done = subprocess.run(
        [PYTHON, "-c", SAVE_UNDER_FIRE, str(path), "25"],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, **ENV},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(outcomes) == 25
    torn = [o for o in outcomes if "error" in o or not o["whole"]]
    assert torn == [], f"a kill left a torn file under the final name: {torn}"
    # The kills did land inside saves: a temporary file was left behind by some of them.
    assert any(o["in_flight"] for o in outcomes)
    assert [p.name for p in tmp_path.iterdir() if p.name != path.name] in ([], [path.name + ".tmp"])


def test_atomic_torch_save_leaves_no_temporary_file_and_fsyncs(tmp_path: Path, monkeypatch):
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(loop.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    path = atomic_torch_save({"model": {"w": torch.ones(3)}, "iter_num": 5}, tmp_path / "c.pt")
    assert path == tmp_path / "c.pt"
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]
    assert torch.load(path, weights_only=True)["iter_num"] == 5
    assert len(synced) == 2, "the file, then its folder"


# ----------------------------------------------------------------------------- under the daemon

MAX_ITERS = 60
SAVE_EVERY = 10


def loop_argv(*extra: str) -> list[str]:
    return [
        PYTHON,
        str(LOOP),
        "--max-iters",
        str(MAX_ITERS),
        "--save-every",
        str(SAVE_EVERY),
        *extra,
    ]


def loop_run(run_dir: Path, *extra: str, **tables) -> Path:
    return make_run(
        run_dir,
        loop_argv(*extra),
        run={"name": run_dir.name},
        trainer={
            "stop_timeout_s": 120.0,
            "total_steps": MAX_ITERS,
            "env": {**ENV, "HF_HUB_OFFLINE": "1"},
            **tables.pop("trainer", {}),
        },
        checkpoints={"format": "torch-pt", "keep_last": 20},
        telemetry={"parser": "nanogpt"},
        restart={
            "backoff_initial_s": 0.0,
            "backoff_max_s": 1.0,
            "max_restarts_without_progress": 10,
            "stall_timeout_s": 300.0,
        },
        **tables,
    )


def pt_checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:11]) for p in (run_dir / "checkpoints").glob("ckpt_??????.pt"))


def losses_by_step(run_dir: Path) -> dict[int, tuple[float, int]]:
    """.loss.json read as the readers do: the newest segment's (loss, seg) per step."""
    newest: dict[int, tuple[float, int]] = {}
    for line in (run_dir / ".loss.json").read_text().splitlines():
        record = json.loads(line)
        step, seg = record["step"], record["seg"]
        if step not in newest or seg >= newest[step][1]:
            newest[step] = (record["loss"], seg)
    return newest


def replay_audit(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, earlier loss, replayed loss) for every replayed step whose loss differs."""
    seen: dict[int, float] = {}
    differ = []
    for line in (run_dir / ".loss.json").read_text().splitlines():
        record = json.loads(line)
        step, value = record["step"], record["loss"]
        if step in seen and seen[step] != value:
            differ.append((step, seen[step], value))
        seen[step] = value
    return differ


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The run nobody interrupts, outside the daemon: its final checkpoint."""
    out = tmp_path_factory.mktemp("straight")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWARDEN_")}
    done = subprocess.run(
        [*loop_argv("--out-dir", str(out / "checkpoints"))],
        capture_output=True,
        text=True,
        timeout=400,
        env={**env, **ENV},
        cwd=out,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "checkpoints" / f"ckpt_{MAX_ITERS:06d}.pt"


def assert_same_weights(final: Path, straight: Path) -> None:
    got = torch.load(final, weights_only=True)
    want = torch.load(straight, weights_only=True)
    assert got["iter_num"] == want["iter_num"] == MAX_ITERS
    assert got["model"].keys() == want["model"].keys()
    for name, tensor in want["model"].items():
        assert torch.equal(got["model"][name], tensor), f"{name} differs"
    for key, state in want["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(got["optimizer"]["state"][key][name], value), f"adam {key}.{name}"


def trainer_of(daemon: DaemonProcess) -> int:
    pid = daemon.status()["trainer_pid"]
    assert belongs_to_run(pid, daemon.run_dir)
    return int(pid)


def test_save_then_stop_under_the_daemon_lose_nothing(tmp_path: Path):
    run_dir = loop_run(tmp_path / "run", "--sleep", "0.2")
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 3, 240, 0.2, what="steps")
        assert set(daemon.status()["handles"]) >= {"SIGUSR1", "SIGTERM"}
        trainer = trainer_of(daemon)

        saved = daemon.request("save", wait=True, timeout_s=120)
        assert saved["step"] in pt_checkpoints(run_dir)
        assert saved["step"] % SAVE_EVERY != 0, "the requested save, not a periodic one"
        wait_for(
            lambda: daemon.status()["step"] >= saved["step"] + 3, 120, 0.2, what="training goes on"
        )
        assert daemon.status()["trainer_pid"] == trainer

        result = daemon.request("stop", timeout=180)
        assert result["state"] == "stopped"
        assert result["outcome"] == "saved" and result["steps_lost"] == 0, result
        stopped = next(r for r in journal(run_dir) if r["kind"] == "trainer_stopped")
        assert stopped["returncode"] == 0
        # nanoGPT's iter_num is the next iteration to run: the stop's checkpoint holds every
        # logged step.
        assert pt_checkpoints(run_dir)[-1] == stopped["last_step"] + 1
        assert not [r for r in journal(run_dir) if r["kind"] == "crash"]


@pytest.mark.slow  # three kills, one mid-save, 35-58 s: run by .ci/run (docs/testing.md)
def test_sigkills_one_mid_save_end_bit_identical_to_an_uninterrupted_run(
    tmp_path: Path, straight: Path
):
    slow = 30  # the save of iter 30 holds its .tmp open long enough to be killed in
    run_dir = loop_run(tmp_path / "run", "--sleep", "0.05", "--slow-save-at", str(slow))
    with running_daemon(run_dir) as daemon:
        kills = 0
        # Two kills between checkpoints, each after a few unsaved steps...
        for at_least in (14, 25):
            wait_for(lambda s=at_least: (daemon.status().get("step") or 0) >= s, 240, 0.05)
            kill_quietly(trainer_of(daemon))
            kills += 1
            wait_for(lambda k=kills: daemon.status()["restarts"] >= k, 120, 0.1, what="restart")
        # ...and one in the middle of writing the checkpoint of iter 30.
        tmp = run_dir / "checkpoints" / f"ckpt_{slow:06d}.pt.tmp"
        wait_for(tmp.exists, 240, 0.02, what="the slow save in flight")
        kill_quietly(trainer_of(daemon))
        kills += 1
        assert not (run_dir / "checkpoints" / f"ckpt_{slow:06d}.pt").exists()

        daemon.wait_state("finished", timeout=480)
        spawns = [r for r in journal(run_dir) if r["kind"] == "spawn"]
        assert len(spawns) == kills + 1
        resumed_from = [(r["resume"] or {}).get("step") for r in spawns]
        # Each restart from the newest checkpoint; the last one's (30) was never committed.
        assert resumed_from[0] is None and resumed_from[-1] == 20, resumed_from
        assert resumed_from[1:] == sorted(resumed_from[1:]), resumed_from

    losses = losses_by_step(run_dir)
    assert sorted(losses) == list(range(MAX_ITERS)), "every step logged, none skipped"
    replayed = len((run_dir / ".loss.json").read_text().splitlines()) - MAX_ITERS
    assert replayed > 0, "the kills cost unsaved steps, which were trained again"
    assert replay_audit(run_dir) == [], "replayed steps repeat their losses exactly"
    assert_same_weights(run_dir / "checkpoints" / f"ckpt_{MAX_ITERS:06d}.pt", straight)


def test_a_daemon_sigkill_and_restart_keeps_the_loss_history_right(tmp_path: Path, straight: Path):
    # Slow enough that the trainer is still running when the second daemon starts.
    run_dir = loop_run(tmp_path / "run", "--sleep", "0.15")
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        wait_for(lambda: (daemon.status().get("step") or 0) >= 8, 240, 0.1, what="steps")
        trainer = trainer_of(daemon)
        daemon.kill()
        # The trainer goes on logging while no daemon watches.
        logged = (run_dir / "training.log").stat().st_size
        wait_for(lambda: (run_dir / "training.log").stat().st_size > logged + 100, 120, 0.1)
        # The new daemon stops the trainer it finds (SIGTERM: it saves, nothing lost) and
        # starts a new one from that checkpoint.
        daemon.start()
        daemon.wait_state("finished", timeout=480)
        assert "leftover_trainer_stopped" in [r["kind"] for r in journal(run_dir)]
        assert not pid_alive(trainer)
        spawns = [r for r in journal(run_dir) if r["kind"] == "spawn"]
        assert len(spawns) == 2 and spawns[1]["resume"]["step"] > 8
    finally:
        daemon.cleanup()

    logged_lines = {}
    for line in (run_dir / "training.log").read_text().splitlines():
        if line.startswith("iter "):
            head, rest = line.split(":", 1)
            logged_lines[int(head.split()[1])] = float(rest.split(",")[0].split()[1])
    losses = losses_by_step(run_dir)
    assert sorted(losses) == list(range(MAX_ITERS))
    assert {step: loss for step, (loss, _) in losses.items()} == logged_lines
    assert replay_audit(run_dir) == []
    assert_same_weights(run_dir / "checkpoints" / f"ckpt_{MAX_ITERS:06d}.pt", straight)
