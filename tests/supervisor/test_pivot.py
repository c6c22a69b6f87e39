"""The pivot: the whole transaction against the real reference trainer (its bandit under the
new policy is the point there), and its validation and crash safety at every stage against
the scripted trainer's bandit (the daemon's transaction is the point there)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.support import (
    PYTHON,
    DaemonProcess,
    checkpoints,
    journal,
    journal_kinds,
    reference_run,
    running_daemon,
    scripted_argv,
    scripted_run,
    wait_for,
)
from trainwarden.plugins.formats.andrea_bin import checkpoint_name
from trainwarden.supervisor.errors import CommandRefused
from trainwarden.supervisor.store.losshistory import LossHistory

pytestmark = pytest.mark.timeout(300)

NEW = {"caps": {"docs": 0.2}, "floors": {"tests": 0.3}}


def bandit(run_dir: Path) -> dict:
    """The trainer's bandit state; {} until a (new) trainer has written one."""
    try:
        return orjson.loads((run_dir / ".state.json").read_bytes())
    except FileNotFoundError:
        return {"step": -1, "arms": {}}


def bandit_run(run_dir: Path, arms: str = "docs,code,tests") -> Path:
    """The scripted trainer with a data bandit: endless, saving every 1,000 steps and on
    SIGUSR1, samples every 10 steps."""
    return scripted_run(
        run_dir, *BANDIT_ARGS, "--arms", arms, checkpoints={"keep_last": 3}
    )  # fmt: skip


BANDIT_ARGS = ("--steps", "100000000", "--save-every", "1000", "--dt", "0.02", "--usr1", "save",
               "--sample-every", "10")  # fmt: skip


def ready_for_pivot(daemon: DaemonProcess) -> None:
    daemon.wait_state("running", timeout=60)
    wait_for(lambda: (daemon.run_dir / ".state.json").exists(), 60, what=".state.json")
    wait_for(lambda: (daemon.run_dir / ".samples.json").exists(), 60, what=".samples.json")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_new_policy_in_force(run_dir: Path, pivot_step: int) -> None:
    """The trainer runs under the new caps/floors with a fresh bandit from the pivot point."""
    wait_for(
        lambda: (
            (s := bandit(run_dir)).get("policy", {}).get("arms", {}).get("docs", {}).get("cap")
            == 0.2
            and s["step"] > pivot_step
        ),
        90,
        what="the trainer's state under the new policy",
    )
    state = bandit(run_dir)
    arms = state["arms"]
    assert arms["docs"]["cap"] == 0.2 and arms["tests"]["floor"] == 0.3
    assert arms["docs"]["prob"] <= 0.2 + 1e-9 and arms["tests"]["prob"] >= 0.3 - 1e-9
    assert state["phase"]["pivots"] >= 1
    policy = orjson.loads((run_dir / "policy.json").read_bytes())
    assert policy["arms"]["docs"]["cap"] == 0.2 and policy["arms"]["tests"]["floor"] == 0.3


def test_full_pivot(tmp_path: Path):
    run_dir = reference_run(tmp_path / "run", 1_000_000, 30, "--sample-every", "10")
    with running_daemon(run_dir) as daemon:
        ready_for_pivot(daemon)
        old_state = (run_dir / ".state.json").read_bytes()
        result = daemon.request("pivot", timeout=120, **NEW)
        step = result["step"]
        archive = run_dir / result["archive"]
        assert archive.parent == run_dir / "archive" and archive.name.startswith(
            f"pivot-{step:06d}-"
        )
        assert {p.name for p in archive.iterdir()} >= {
            ".samples.json",
            ".state.json",
            "policy.json",
            "pivot.json",
        }
        assert orjson.loads((archive / ".state.json").read_bytes())["arms"]["docs"]["cap"] == 1.0
        assert orjson.loads(old_state)["arms"]["docs"]["cap"] == 1.0
        pivot_ckpt = run_dir / "checkpoints" / checkpoint_name(step)
        pinned_hash = sha(pivot_ckpt)
        # The pivot's reply comes before the new trainer's start (its checkpoint's digest
        # is checked first).
        spawn = wait_for(
            lambda: next(
                (r for r in journal(run_dir) if r["kind"] == "spawn" and r["pivot"]), None
            ),
            60,
            what="the trainer started after the pivot",
        )
        records = journal(run_dir)
        assert spawn["resume"]["step"] == step and spawn["pivot"] is True
        assert [r["stage"] for r in records if r["kind"] == "pivot_stage"] == [
            "saving",
            "pin",
            "stopping",
            "archiving",
            "writing_policy",
        ]
        assert_new_policy_in_force(run_dir, step)
        # What the stop saved under the old policy is set aside, and said so calmly.
        set_aside = daemon.request("checkpoints")["quarantined"]
        assert set_aside and all(
            q["why"] == f"set aside by the pivot at step {step:,}" and q["alarming"] is False
            for q in set_aside
        ), set_aside
        log = (run_dir / "training.log").read_text()
        assert f"resuming from {pivot_ckpt} at step {step}, bandit phase 1" in log
        # The pivot checkpoint is pinned and outlives retention.
        for _ in range(4):
            daemon.request("save", wait=True)
        assert step in checkpoints(run_dir) and sha(pivot_ckpt) == pinned_hash
        assert any(
            c["step"] == step and c["pinned"] for c in daemon.request("checkpoints")["checkpoints"]
        )
        status = daemon.status()
        assert status["state"] == "running"
        last = status["step"]
    # .loss.json is never moved and is continuous: every step once in the newest segment.
    history = LossHistory.load(run_dir / ".loss.json")
    steps = [row.step for row in history]
    assert steps == list(range(1, len(steps) + 1)) and steps[-1] >= last
    assert (run_dir / ".loss.json").exists() and not list(run_dir.glob("archive/*/.loss.json"))


INVALID = [
    ({"caps": {"docs": 1.5}}, "cap 1.5 is outside [0, 1]"),
    ({"floors": {"docs": -0.1}}, "floor -0.1 is outside [0, 1]"),
    ({"caps": {"docs": 0.1}, "floors": {"docs": 0.2}}, "floor 0.2 is above cap 0.1"),
    ({"floors": {"docs": 0.5, "code": 0.4, "tests": 0.3}}, "floors sum to 1.2"),
    ({"caps": {"docs": 0.3, "code": 0.3, "tests": 0.3}}, "caps sum to 0.9"),
    ({"caps": {"nosuch": 0.5}}, "unknown arm 'nosuch'"),
    ({"caps": {"docs": "half"}}, "'caps' must map arm names to numbers"),
    ({}, "a pivot needs 'caps' or 'floors'"),
]


@pytest.fixture(scope="module")
def pivot_daemon(tmp_path_factory: pytest.TempPathFactory):
    run_dir = bandit_run(tmp_path_factory.mktemp("pivot") / "run")
    with running_daemon(run_dir) as daemon:
        ready_for_pivot(daemon)
        yield daemon


@pytest.mark.parametrize(("args", "message"), INVALID)
def test_invalid_policies_change_nothing(pivot_daemon: DaemonProcess, args: dict, message: str):
    run_dir = pivot_daemon.run_dir
    before = pivot_daemon.status()
    with pytest.raises(CommandRefused) as err:
        pivot_daemon.request("pivot", **args)
    assert err.value.code == "bad_argument" and message in str(err.value)
    after = pivot_daemon.status()
    assert after["trainer_pid"] == before["trainer_pid"] and after["state"] == "running"
    assert not (run_dir / "policy.json").exists() and not (run_dir / "archive").exists()
    assert "pivot_stage" not in journal_kinds(run_dir)


def test_pivot_is_refused_when_not_running(tmp_path: Path):
    run_dir = bandit_run(tmp_path / "run")
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running", timeout=60)
        daemon.request("stop")
        with pytest.raises(CommandRefused) as err:
            daemon.request("pivot", **NEW)
        assert err.value.code == "wrong_state" and "stopped" in str(err.value)


def test_zombie_arm_is_reported_and_cannot_be_named(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # Three arms first; then the run continues with the `tests` arm's data gone.
    first = scripted_argv("--steps", "20", "--arms", "docs,code,tests")
    subprocess.run(first, cwd=run_dir, check=True, capture_output=True, timeout=120)
    bandit_run(run_dir, "docs,code")
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running", timeout=60)
        wait_for(
            lambda: bandit(run_dir).get("zombies") == ["tests"] and bandit(run_dir)["step"] > 20,
            60,
            what="a bandit state with the zombie",
        )
        with pytest.raises(CommandRefused) as err:
            daemon.request("pivot", floors={"tests": 0.1})
        assert "zombie" in str(err.value) and "'tests'" not in str(err.value).split("name only")[1]
        result = daemon.request("pivot", timeout=120, caps={"docs": 0.6})
        assert result["zombies"] == ["tests"]
        policy = orjson.loads((run_dir / "policy.json").read_bytes())
        assert set(policy["arms"]) == {"docs", "code"}


STAGES = ["saving", "stopping", "archiving", "writing_policy"]
FAULT_HOOKS = Path(__file__).resolve().parent / "fault_hooks"


def dying_at(stage: str) -> dict[str, str]:
    """The environment of a daemon that SIGKILLs itself once `stage` is journaled (see
    fault_hooks/sitecustomize.py)."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOKS), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "TRAINWARDEN_TEST_DIE_AT_PIVOT_STAGE": stage}


@pytest.mark.parametrize("stage", STAGES)
def test_daemon_killed_at_each_stage_ends_consistent(tmp_path: Path, stage: str):
    run_dir = bandit_run(tmp_path / "run")
    daemon = DaemonProcess(run_dir, env=dying_at(stage)).start()
    try:
        ready_for_pivot(daemon)
        with daemon.client(timeout=120) as client:
            client.sock.sendall(orjson.dumps({"id": 1, "cmd": "pivot", **NEW}) + b"\n")
            daemon.wait_exit(60)
        assert daemon.proc is not None and daemon.proc.returncode == -9
        plan = [r for r in journal(run_dir) if r["kind"] == "state"][-1]["state"]["pivot"]
        assert plan["stage"] == stage
        restarted = DaemonProcess(run_dir).start()
        try:
            restarted.wait_state("running", timeout=90)
            records = journal(run_dir)
            spawn = [r for r in records if r["kind"] == "spawn"][-1]
            if stage in ("saving", "stopping"):
                assert "pivot_rolled_back" in journal_kinds(run_dir)
                assert not (run_dir / "policy.json").exists()
                assert spawn["pivot"] is False
                wait_for(
                    lambda: bandit(run_dir)["step"] > (spawn["resume"] or {}).get("step", 0),
                    60,
                    what="training under the old policy",
                )
                assert bandit(run_dir)["arms"]["docs"]["cap"] == 1.0
                if plan["step"] is not None and plan["was_pinned"] is False:
                    assert not any(
                        c["pinned"] for c in restarted.request("checkpoints")["checkpoints"]
                    )
            else:
                assert "pivot_resumed" in journal_kinds(run_dir)
                step = plan["step"]
                assert spawn["resume"]["step"] == step and spawn["pivot"] is True
                archive = run_dir / "archive"
                (folder,) = list(archive.iterdir())
                assert {".state.json", ".samples.json", "policy.json"} <= {
                    p.name for p in folder.iterdir()
                }
                assert (
                    orjson.loads((folder / ".state.json").read_bytes())["arms"]["docs"]["cap"]
                    == 1.0
                )
                assert_new_policy_in_force(run_dir, step)
                assert all(s <= step for s in checkpoints(run_dir))
                assert "pivot" in journal_kinds(run_dir)
            assert restarted.status()["state"] == "running"
        finally:
            restarted.cleanup()
    finally:
        daemon.cleanup()


def test_cli_pivot(tmp_path: Path):
    run_dir = bandit_run(tmp_path / "run")
    with running_daemon(run_dir) as daemon:
        ready_for_pivot(daemon)
        bad = subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", "pivot", str(run_dir), "--cap", "docs"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode == 2 and "expected ARM=NUMBER" in bad.stderr
        refused = subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", "pivot", str(run_dir), "--cap", "docs=2"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 1 and "outside [0, 1]" in refused.stderr
        ok = subprocess.run(
            [
                PYTHON,
                "-m",
                "trainwarden.supervisor",
                "pivot",
                str(run_dir),
                "--cap",
                "docs=0.2",
                "--floor",
                "tests=0.3",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert ok.returncode == 0 and "pivot done at step" in ok.stdout
        assert_new_policy_in_force(run_dir, int(ok.stdout.split("step ")[1].split(";")[0]))
