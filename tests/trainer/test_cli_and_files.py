"""The command line, the banner, and the .state.json / .samples.json / policy files."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.trainer.trainer_process import (
    COMMON_ARGS,
    REPO,
    STEPS,
    checkpoint,
    run_trainer,
    step_losses,
)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--steps", "0"], "must be at least 1"),
        (["--steps", "10", "--preset", "huge"], "invalid choice: 'huge'"),
        (["--steps", "10", "--arms", "docs,nope"], "unknown arm 'nope'"),
        (["--save-every", "5"], "--steps"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, fragment):
    result = run_trainer(tmp_path, *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainer: error:")
    assert fragment in lines[0]


def test_invalid_policy_is_refused_before_training(tmp_path):
    (tmp_path / "policy.json").write_text(json.dumps({"arms": {"nope": {"cap": 0.5}}}))
    result = run_trainer(tmp_path, "--steps", "5")
    assert result.returncode == 2
    assert "unknown arm 'nope': known arms are docs, code, tests" in result.stderr
    assert "step:" not in result.stdout


def test_help_documents_the_test_hooks():
    result = subprocess.run(
        [sys.executable, "-m", "trainwarden.trainer", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0
    for needle in ("--crash-at-step", "TRAINER_TEST_SLOW_SAVE_S", "TRAINWARDEN_RESUME"):
        assert needle in result.stdout


def test_step_lines_banner_and_files_of_a_run(straight):
    assert sorted(straight.losses) == list(range(1, STEPS + 1))
    step_line = re.compile(
        r"^step: \d+, loss: \d+\.\d{6}, dt: \d+\.\d{4}, lr: \d\.\d{6}, arm: (docs|code|tests),"
        r" tokens: 512$"
    )
    lines = straight.stdout.splitlines()
    assert all(step_line.match(line) for line in lines if line.startswith("step:"))
    assert lines[0].startswith("trainer: preset tiny, 120576 params, 512 tokens/step")
    for step in range(10, STEPS + 1, 10):
        assert checkpoint(straight.run_dir, step).exists()

    state = json.loads((straight.run_dir / ".state.json").read_text())
    assert state["step"] == STEPS
    assert set(state["arms"]) == {"docs", "code", "tests"}
    assert sum(arm["pulls"] for arm in state["arms"].values()) == STEPS
    assert state["phase"] == {"pivots": 0, "steps_in_phase": STEPS, "started_at_step": 0}
    assert state["zombies"] == []

    samples = json.loads((straight.run_dir / ".samples.json").read_text())["samples"]
    assert [(s["step"], s["arm"]) for s in samples] == [
        (step, arm) for step in (30, 60) for arm in ("docs", "code", "tests")
    ]
    assert all(len(s["text"]) > 0 and s["t"] > 0 for s in samples)

    sidecar = json.loads(checkpoint(straight.run_dir, STEPS).with_suffix(".json").read_text())
    assert sidecar["step"] == STEPS and sidecar["n_params"] == 120576
    assert sidecar["optimizer"]["step_counts"] == [STEPS] * len(sidecar["optimizer"]["step_counts"])


def test_pivot_with_a_vanished_arm(straight, tmp_path):
    """TRAINWARDEN_PIVOT restarts the bandit under the new policy; the arm whose data is
    gone becomes a zombie; --resume wins over TRAINWARDEN_RESUME."""
    copy = straight.copy_checkpoint(50, tmp_path)
    policy = {"arms": {"docs": {"floor": 0.5, "cap": 0.7}, "tests": {"cap": 0.1}}}
    (tmp_path / "policy.json").write_text(json.dumps(policy))
    env = {"TRAINWARDEN_RESUME": str(tmp_path / "no-such.bin"), "TRAINWARDEN_PIVOT": "1"}

    result = run_trainer(
        tmp_path, *COMMON_ARGS, "--arms", "docs,code", "--resume", str(copy), env=env
    )

    assert result.returncode == 0, result.stderr
    assert sorted(step_losses(result.stdout)) == list(range(51, STEPS + 1))
    assert "arm 'tests' from the checkpoint has no data source any more" in result.stderr
    assert "arm: tests" not in result.stdout
    state = json.loads((tmp_path / ".state.json").read_text())
    assert state["zombies"] == ["tests"]
    assert set(state["arms"]) == {"docs", "code"}
    assert state["phase"] == {"pivots": 1, "steps_in_phase": 10, "started_at_step": 50}
    assert sum(arm["pulls"] for arm in state["arms"].values()) == 10  # fresh counts
    assert 0.5 <= state["arms"]["docs"]["prob"] <= 0.7
    assert state["policy"]["arms"]["docs"] == {"cap": 0.7, "floor": 0.5}
