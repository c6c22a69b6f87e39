"""`trainwarden compare` on histories written in their documented formats (lossdb, evaldb,
branches): the branch point, the table at matching steps, the first difference, the lower
run over the last window, the --json arrays, and each refusal in one line; and the
daemon's read-only `history_of` and `related_runs` (what the TUI overlays)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.support import PYTHON, running_daemon, scripted_run, wait_for
from tests.support.histories import make_run
from trainwarden.supervisor.cli.compare import ema
from trainwarden.supervisor.errors import CommandRefused
from trainwarden.supervisor.shell.telemetry import Monitor
from trainwarden.supervisor.store.lossdb import LossWriter
from trainwarden.supervisor.store.runseries import read_run_series


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "compare", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def descending(start: float, slope: float, steps: range) -> dict[int, float]:
    return {s: start - slope * s for s in steps}


def base_and_branches(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A base run of 300 steps, and two branches made from it at step 100: A learns
    slower than B; both repeat the base's loss for step 101 (same weights, same batch)."""
    base = make_run(tmp_path / "base", descending(5.0, 0.001, range(1, 301)), evals={100: 4.95})
    a_losses = descending(5.0, 0.001, range(101, 102)) | descending(4.99, 0.0005, range(102, 301))
    b_losses = descending(5.0, 0.001, range(101, 102)) | descending(4.99, 0.002, range(102, 301))
    a = make_run(tmp_path / "a", a_losses, parent=base, step=100, evals={200: 4.9, 300: 4.85})
    b = make_run(tmp_path / "b", b_losses, parent=base, step=100, evals={200: 4.7, 300: 4.5})
    return base, a, b


def test_two_branches_of_one_run_table_first_difference_and_lower(tmp_path: Path):
    base, a, b = base_and_branches(tmp_path)
    done = cli(str(a), str(b))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"branch point: step 100, both from {base.resolve()}" in out
    assert "first difference > 0: step 102" in out
    assert "lower over the last 100 steps (201-300): B" in out
    assert "validation at step 300: B, A 4.8500 vs B 4.5000" in out
    table = out[out.index("step  ") :].splitlines()
    assert "A val" in table[0] and "B val" in table[0]
    rows = [line.split() for line in table[1:]]
    assert 20 <= len(rows) <= 24  # ~20 decimated rows, plus the eval steps
    steps = [int(r[0].replace(",", "")) for r in rows]
    assert steps[0] == 101 and steps[-1] == 300 and steps == sorted(steps)
    assert {102, 200, 300} <= set(steps)
    row_101 = rows[steps.index(101)]
    assert row_101[1] == row_101[3] == f"{5.0 - 0.101:.4f}"  # identical from the same weights
    row_300 = rows[steps.index(300)]
    assert float(row_300[1]) == round(4.99 - 0.0005 * 300, 4)
    assert float(row_300[3]) == round(4.99 - 0.002 * 300, 4)
    assert row_300[-2:] == ["4.8500", "4.5000"]


def test_parent_and_branch_json_arrays_stitch_the_parents_steps(tmp_path: Path):
    base = make_run(tmp_path / "base", descending(5.0, 0.01, range(1, 51)), evals={20: 4.8})
    # The branch replays step 21 once more (a restart), the newer segment wins.
    branch = make_run(tmp_path / "br", {21: 9.0, 22: 4.0, 23: 3.5}, parent=base, step=20)
    with LossWriter(branch / ".loss.json") as writer:
        writer.append(21, 4.5, 0.1, 2000.0, 2)
    done = cli(str(base), str(branch), "--json")
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    assert result["branch"] == {"run": str(base.resolve()), "step": 20}
    assert result["steps"] == [20, 21, 22, 23]
    assert result["a_loss"] == [5.0 - 0.2, 5.0 - 0.21, 5.0 - 0.22, 5.0 - 0.23]
    assert result["b_loss"] == [5.0 - 0.2, 4.5, 4.0, 3.5]
    assert result["a_ema"][0] == result["b_ema"][0]  # one history up to the branch point
    assert result["a_ema"][1] != result["b_ema"][1]
    assert result["val_steps"] == [20] and result["a_val"] == result["b_val"] == [4.8]
    assert result["first_difference"] == {"step": 21, "a": 5.0 - 0.21, "b": 4.5}
    assert result["lower"]["run"] == "b" and result["lower"]["from_step"] == 21
    assert result["b"]["lineage"] == [[str(base.resolve()), 20], [str(branch.resolve()), None]]
    text = cli(str(base), str(branch)).stdout
    assert "A is B's ancestor" in text


def test_tolerance_and_window(tmp_path: Path):
    base = make_run(tmp_path / "base", {s: 3.0 for s in range(1, 11)})
    a = make_run(tmp_path / "a", {s: 3.0 + 0.001 * s for s in range(11, 41)}, parent=base, step=10)
    # B is higher early on and lower over its last 5 steps.
    b = make_run(
        tmp_path / "b",
        {s: 3.5 if s <= 35 else 2.0 for s in range(11, 41)},
        parent=base,
        step=10,
    )
    result = orjson.loads(cli(str(a), str(b), "--json", "--tolerance", "0.6").stdout)
    assert result["first_difference"]["step"] == 36
    assert result["lower"]["run"] == "a"  # over 100 steps: the whole of both branches
    result = orjson.loads(cli(str(a), str(b), "--json", "--window", "5").stdout)
    assert result["lower"]["run"] == "b" and result["lower"]["from_step"] == 36
    assert result["first_difference"]["step"] == 11
    same = cli(str(a), str(a.parent / "a"), "--tolerance", "1")
    assert same.returncode == 2 and "the same run" in same.stderr


def test_nan_losses_are_shown_not_hidden(tmp_path: Path):
    base = make_run(tmp_path / "base", {1: 3.0, 2: 2.9})
    a = make_run(tmp_path / "a", {3: math.nan, 4: 2.5}, parent=base, step=2, evals={4: math.nan})
    b = make_run(tmp_path / "b", {3: 2.8, 4: 2.7}, parent=base, step=2, evals={4: 2.6})
    result = orjson.loads(cli(str(a), str(b), "--json").stdout)
    assert result["a_loss"][1] == "nan" and result["first_difference"]["step"] == 3
    assert result["lower"]["val"] == {"run": None, "step": 4, "a": "nan", "b": 2.6}
    assert "nan" in cli(str(a), str(b)).stdout


def test_lineage_of_a_branch_of_a_branch_cuts_the_older_run(tmp_path: Path):
    root = make_run(tmp_path / "root", {s: 10.0 for s in range(1, 101)})
    middle = make_run(tmp_path / "mid", {s: 20.0 for s in range(51, 101)}, parent=root, step=50)
    # Branched from `middle` at step 30, a step `middle` took from `root`.
    leaf = make_run(tmp_path / "leaf", {s: 30.0 for s in range(31, 41)}, parent=middle, step=30)
    series = read_run_series(leaf)
    assert series.train.steps.tolist() == list(range(1, 41))
    assert series.train.losses.tolist() == [10.0] * 30 + [30.0] * 10
    result = orjson.loads(cli(str(leaf), str(middle), "--json").stdout)
    assert result["branch"] == {"run": str(root.resolve()), "step": 30}


def test_refusals_are_one_line(tmp_path: Path):
    base, a, _ = base_and_branches(tmp_path)
    stranger = make_run(tmp_path / "stranger", {1: 3.0})
    empty = tmp_path / "empty"
    empty.mkdir()
    orphan = make_run(tmp_path / "orphan", {101: 3.0}, parent=tmp_path / "moved", step=100)
    cases = [
        ((str(tmp_path / "nope"), str(a)), 2, "no such run directory"),
        ((str(a), str(empty)), 1, "no loss history yet"),
        ((str(a), str(stranger)), 2, "share no ancestor step"),
        ((str(a), str(orphan)), 2, f"is a branch of {tmp_path / 'moved'}, which is not reachable"),
        ((str(a), str(base), "--window", "0"), 2, "--window 0"),
        ((str(a), str(base), "--tolerance", "-1"), 2, "--tolerance -1"),
    ]
    for args, code, words in cases:
        done = cli(*args)
        assert done.returncode == code, (args, done.stderr)
        assert words in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert done.stdout == ""


@pytest.mark.timeout(300)
def test_daemon_answers_history_of_other_runs_read_only(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000000", "--dt", "0.02")
    base = make_run(tmp_path / "base", {s: 7.0 - 0.01 * s for s in range(1, 101)}, evals={50: 6.6})
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a run")
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running")
        wait_for(lambda: (daemon.status().get("step") or 0) >= 5, 120, what="five steps")
        branch = make_run(tmp_path / "br", {6: 1.5, 7: 1.25}, parent=run_dir, step=5)
        before = (base / ".loss.json").read_bytes()

        other = daemon.request("history_of", run="br", points=100)
        assert other["run"] == str(branch.resolve())
        assert other["step"] == [1, 2, 3, 4, 5, 6, 7] and other["count"] == 7
        own = daemon.request("history", end=5)
        assert other["mean"][:5] == own["mean"]  # the parent's steps up to the branch point
        assert other["mean"][5:] == [1.5, 1.25]
        assert other["lineage"] == [[str(run_dir.resolve()), 5], [str(branch.resolve()), None]]

        decimated = daemon.request("history_of", run=str(base), start=11, end=90, points=8)
        assert len(decimated["step"]) == 8 and decimated["count"] == 80
        assert decimated["first_step"] == 11 and decimated["last_step"] == 90
        assert decimated["val"] == {"step": [50], "loss": [6.6]}
        assert (base / ".loss.json").read_bytes() == before
        assert not (base / ".trainwarden").exists()  # nothing written for the other run

        for run, code in (
            ("notes", "not_a_run"),
            (str(tmp_path / "gone"), "not_a_run"),
            (7, "bad_argument"),
        ):
            with pytest.raises(CommandRefused) as refused:
                daemon.request("history_of", run=run)
            assert refused.value.code == code, refused.value

        related = daemon.request("related_runs")["runs"]
        by_name = {r["name"]: r["relation"] for r in related}
        assert by_name == {"base": "sibling", "br": "branch"}
        paths = {r["path"] for r in related}
        assert str(branch.resolve()) in paths
        assert daemon.status()["state"] == "running"


def test_ema_is_the_one_the_daemon_shows():
    rng = np.random.default_rng(7)
    losses = rng.normal(3.0, 0.5, 1500)
    losses[[0, 1, 300, 301, 999]] = math.nan
    losses[700] = math.inf
    monitor = Monitor()
    shown = []
    for step, loss in enumerate(losses.tolist(), 1):
        monitor.observe(step, loss, 0.1, float(step))
        value = monitor.snapshot()["loss_ema"]
        shown.append(math.nan if value is None else value)
    assert np.allclose(ema(losses, Monitor().settings.ema_beta), shown, rtol=1e-12, equal_nan=True)
