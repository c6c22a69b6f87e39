"""`trainwarden branch`: audit branches of a reference-trainer run, their refusals, and the
history a branch shows (its ancestors' steps up to the branch step, then its own)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.support import (
    PYTHON,
    SCRIPTED_TRAINER,
    journal,
    make_run,
    reference_run,
    running_daemon,
    scripted_run,
    wait_for,
)
from trainwarden.supervisor.store.branch_history import ancestry_key, inherited
from trainwarden.supervisor.store.branches import BranchInfo, write_branch
from trainwarden.supervisor.store.losshistory import LossHistory
from trainwarden.trainer.bandit import Bandit

pytestmark = pytest.mark.timeout(600)

SEED = 1337
"""tests.support.trainer_argv's default seed: the bandit's draws depend on it."""
STEP_LINE = re.compile(r"^step: (\d+), loss: [^,]+, .*arm: (\w+)")


def branch(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "branch", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_refusal(done: subprocess.CompletedProcess[str], code: int, words: str) -> str:
    assert done.returncode == code, f"exit {done.returncode}: {done.stdout}{done.stderr}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert words in lines[0], lines[0]
    return lines[0]


def fingerprint(paths: list[Path]) -> dict[str, tuple[str, int]]:
    """sha256 and mtime_ns of each file: what 'never modified' compares."""
    return {
        str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in paths
    }


def losses(run_dir: Path) -> dict[int, float]:
    return {row.step: row.loss for row in LossHistory.load(run_dir / ".loss.json")}


def arm_at(run_dir: Path, step: int) -> str | None:
    """The arm the trainer logged for `step` (its step line's `arm:`)."""
    try:
        text = (run_dir / "training.log").read_text(errors="replace")
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        found = STEP_LINE.match(line)
        if found and int(found.group(1)) == step:
            return found.group(2)
    return None


def journaled_digest(run_dir: Path, step: int) -> str | None:
    for record in journal(run_dir):
        if record.get("kind") == "checkpoint" and record.get("step") == step:
            return str(record["digest"])
    return None


def no_leftovers(parent: Path) -> None:
    assert not [p.name for p in parent.iterdir() if p.name.endswith(".branching")]


# ----------------------------------------------------------------------------- the audit branches


def first_arm(saved: dict, policy: dict, step: int) -> str:
    """The arm a trainer resumed with the bandit `saved` under `policy` draws at `step`."""
    bandit, _ = Bandit.from_state(saved, list(saved["arms"]), policy, SEED)
    return bandit.choose(step)


def test_two_branches_train_on_from_the_same_weights(tmp_path: Path):
    """Branch A draws only from the arm the source drew at N+1; branch B gives that arm a
    fixed share f < 1, chosen (through the trainer's own bandit) so that B too draws it at
    N+1. Both then take step N+1 from identical weights on identical data: its loss equals
    the source's step N+1 loss bit for bit. Later B also draws other arms, so they part."""
    n, ahead = 100, 30
    src = reference_run(
        tmp_path / "src", 1_000_000, n, checkpoints={"keep_last": 1000}
    )  # keeps training all along; keeps every checkpoint
    with running_daemon(src) as source:
        wait_for(lambda: journaled_digest(src, n), 180, what=f"step {n} journaled as verified")
        wait_for(lambda: arm_at(src, n + 1), 60, what=f"the source's step {n + 1}")
        before = source.status()
        ckpt = src / "checkpoints" / f"step_{n:06d}.bin"
        kept = [src / "trainwarden.toml", ckpt, ckpt.with_suffix(".json")]
        unchanged = fingerprint(kept)
        saved = orjson.loads(ckpt.with_suffix(".json").read_bytes())["bandit"]
        x = arm_at(src, n + 1)
        assert x is not None
        share = next(
            (
                f / 20
                for f in range(4, 20)
                if first_arm(saved, {"arms": {x: {"cap": f / 20, "floor": f / 20}}}, n + 1) == x
            ),
            None,
        )
        assert share is not None, f"no share of {x!r} below 1 draws it at step {n + 1}"
        assert first_arm(saved, {"arms": {x: {"floor": 1.0}}}, n + 1) == x

        a, b = tmp_path / "a", tmp_path / "b"
        made_a = branch(src, a, "--step", n, "--floor", f"{x}=1")
        made_b = branch(src, b, "--step", n, "--cap", f"{x}={share}", "--floor", f"{x}={share}")
        assert made_a.returncode == 0, made_a.stderr
        assert made_b.returncode == 0, made_b.stderr
        assert f"at step {n}" in made_a.stdout and str(a) in made_a.stdout

        records = [orjson.loads((run / "branch.json").read_bytes()) for run in (a, b)]
        assert {r["digest"] for r in records} == {journaled_digest(src, n)}
        assert all(r["parent"] == str(src) and r["step"] == n for r in records)
        assert records[0]["overrides"]["floors"] == {x: 1.0}
        for run in (a, b):
            copied = run / "checkpoints" / ckpt.name
            assert copied.read_bytes() == ckpt.read_bytes()  # bit-identical weights
            assert not (run / ".loss.json").exists()
        policy_b = orjson.loads((b / "policy.json").read_bytes())
        assert policy_b["arms"][x] == {"cap": share, "floor": share}

        with running_daemon(a) as da, running_daemon(b) as db:
            for run in (a, b):
                wait_for(
                    lambda run=run: max(losses(run), default=0) >= n + ahead,
                    240,
                    what=f"{run.name} at step {n + ahead}",
                )
            history = da.request("history", start=n - 4, end=n + 3, points=1000)
            db.stop()
            da.stop()

        la, lb, ls = losses(a), losses(b), losses(src)
        assert min(la) == n + 1 and min(lb) == n + 1  # each branch's own history starts after N
        assert la[n + 1] == lb[n + 1] == ls[n + 1]
        for run in (a, b):
            spawns = [r for r in journal(run) if r.get("kind") == "spawn"]
            assert spawns[0]["resume"]["step"] == n and not spawns[0]["pivot"]
        assert arm_at(a, n + 2) == x
        assert any(la[s] != lb[s] for s in range(n + 2, n + ahead + 1))
        assert any(arm_at(b, s) != x for s in range(n + 2, n + ahead + 1))

        # The branch's history: the parent's steps up to N, then its own, marked as such.
        assert history["branch_step"] == n
        assert history["ancestors"] == [{"run": str(src), "through_step": n}]
        assert history["step"] == list(range(n - 4, n + 4))
        by_step = dict(zip(history["step"], history["mean"], strict=True))
        assert all(by_step[s] == ls[s] for s in range(n - 4, n + 1))
        assert all(by_step[s] == la[s] for s in range(n + 1, n + 4))

        # compare names the branch point and has both curves from it on; inspect on each
        # branch's first checkpoint shows the one parent digest of their branch.json.
        compared = cli("compare", a, b, "--json")
        assert compared.returncode == 0, compared.stderr
        table = orjson.loads(compared.stdout)
        assert table["branch"] == {"run": str(src), "step": n}
        assert table["steps"][0] == n and table["steps"][-1] >= n + ahead
        assert table["a_loss"][1] == table["b_loss"][1] == ls[n + 1]
        assert n + 2 <= table["first_difference"]["step"] <= n + ahead
        assert f"step {n}" in cli("compare", a, b).stdout
        for run in (a, b):
            shown = cli("inspect", run / "checkpoints" / ckpt.name, "--json")
            assert shown.returncode == 0, shown.stderr
            assert orjson.loads(shown.stdout)["branch"]["digest"] == journaled_digest(src, n)

        # The source trained on, undisturbed, its files as they were.
        after = source.status()
        assert after["trainer_pid"] == before["trainer_pid"] and after["state"] == "running"
        assert max(losses(src)) > max(losses(a))
        assert fingerprint(kept) == unchanged
        assert not (src / "branch.json").exists()
    no_leftovers(tmp_path)


def test_branch_without_overrides_retraces_its_parent(src: Path, tmp_path: Path):
    """Same weights, moments, bandit, data position and policy: the branch's steps 11..30
    are the parent's, loss for loss (any difference a branch shows is its overrides')."""
    dest = tmp_path / "dest"
    assert branch(src, dest, "--step", 10).returncode == 0
    with running_daemon(dest) as daemon:
        daemon.wait_state("finished", timeout=240)
        history = daemon.request("history", points=1000)
        daemon.stop()
    own, parent = losses(dest), losses(src)
    assert sorted(own) == list(range(11, 31))
    assert all(own[s] == parent[s] for s in own)
    assert history["step"] == list(range(1, 31)) and history["branch_step"] == 10
    assert history["mean"] == [parent[s] for s in range(1, 31)]
    # Its validation points too: the parent's evaluation at 10, then its own.
    assert history["val"]["step"] == [10, 20, 30]


# ----------------------------------------------------------------------------- refusals


@pytest.fixture(scope="module")
def finished_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reference run supervised to its end: checkpoints 10, 20, 30, journaled verified."""
    run_dir = reference_run(
        tmp_path_factory.mktemp("finished") / "src", 30, 10, checkpoints={"keep_last": 10}
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=240)
        daemon.stop()
    assert all(journaled_digest(run_dir, s) for s in (10, 20, 30))
    return run_dir


@pytest.fixture
def src(finished_source: Path, tmp_path: Path) -> Path:
    """A private copy of the finished run (the tests change it)."""
    copy = tmp_path / "src"
    shutil.copytree(finished_source, copy, symlinks=True)
    return copy


def test_branch_without_a_daemon_takes_the_newest_verified(src: Path, tmp_path: Path):
    dest = tmp_path / "dest"
    done = branch(src, dest, "--set", "restart.stall_timeout_s=300", "--json")
    assert done.returncode == 0, done.stderr
    record = orjson.loads(done.stdout)
    assert record["step"] == 30 and record["digest"] == journaled_digest(src, 30)
    assert record["overrides"]["set"] == {"restart.stall_timeout_s": 300}
    config = (dest / "trainwarden.toml").read_text()
    assert "stall_timeout_s = 300" in config and 'name = "dest"' in config
    assert sorted(p.name for p in (dest / "checkpoints").iterdir()) == [
        "step_000030.bin",
        "step_000030.json",
    ]
    no_leftovers(tmp_path)


def test_config_paths_into_the_source_point_into_the_branch(src: Path, tmp_path: Path):
    text = (src / "trainwarden.toml").read_text()
    text = text.replace('"--run-dir", "."', f'"--run-dir", "{src}"')
    text = text.replace("keep_last = 10", "keep_last = 10\npinned = [40]")
    text += f'\n[mirror]\npath = "{tmp_path / "mirror"}"\n'
    (src / "trainwarden.toml").write_text(text.replace("[trainer]", f'[trainer]\ncwd = "{src}"'))
    dest = tmp_path / "dest"
    done = branch(src, dest)
    assert done.returncode == 0, done.stderr
    config = (dest / "trainwarden.toml").read_text()
    assert f'"--run-dir", "{dest}"' in config and f'cwd = "{dest}"' in config
    assert str(src) not in config.split("\n", 1)[1]  # only the header names the parent
    assert "mirror" not in config.split("\n", 1)[1] and "pinned" not in config
    assert "[mirror] path is not inherited" in done.stdout
    assert "[checkpoints] pinned is not inherited" in done.stdout


def test_a_trainer_living_in_the_run_directory_is_copied_into_the_branch(tmp_path: Path):
    """The README's "your own run" layout: train.py in the run directory, named relatively
    by the command. The branch gets its own copy and resumes at the branch point."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(SCRIPTED_TRAINER, src / "train.py")
    make_run(
        src,
        [PYTHON, "train.py", "--steps", "40", "--save-every", "10", "--dt", "0.01"],
        restart={"backoff_initial_s": 0.0, "backoff_max_s": 1.0},
        checkpoints={"keep_last": 5},
    )
    with running_daemon(src) as daemon:
        daemon.wait_state("finished", timeout=120)
        daemon.stop()
    dest = tmp_path / "dest"
    done = branch(src, dest, "--step", 20)
    assert done.returncode == 0, done.stderr
    assert "copied the files the trainer's command names: train.py" in done.stdout
    assert (dest / "train.py").read_bytes() == (src / "train.py").read_bytes()
    with running_daemon(dest) as daemon:
        daemon.wait_state("finished", timeout=120)
        daemon.stop()
    (spawn,) = [r for r in journal(dest) if r["kind"] == "spawn"]
    assert spawn["resume"]["step"] == 20
    assert sorted(losses(dest)) == list(range(21, 41))
    assert not [r for r in journal(dest) if r["kind"] in ("quarantine", "crash")]


def set_command(run_dir: Path, command: list[str]) -> None:
    """[trainer] command replaced (tests.support.make_run writes it on one line)."""
    config = run_dir / "trainwarden.toml"
    line = "command = " + orjson.dumps(command).decode()
    config.write_text(re.sub(r"(?m)^command = .*$", lambda _: line, config.read_text()))


def test_files_the_command_names_are_copied_and_its_folders_shared(src: Path, tmp_path: Path):
    (src / "train.py").write_text("print('a trainer')\n")
    (src / "conf").mkdir()
    (src / "conf" / "a.yaml").write_text("lr: 0.1\n")
    (src / "data").mkdir()
    command = ["python3", "train.py", "--data", "data", "--cfg=conf/a.yaml", "--steps", "9"]
    set_command(src, command)
    dest = tmp_path / "dest"
    done = branch(src, dest)
    assert done.returncode == 0, done.stderr
    assert "copied the files the trainer's command names: train.py, conf/a.yaml" in done.stdout
    assert f"names the folder {src / 'data'}: the branch uses its parent's" in done.stdout
    assert (dest / "conf" / "a.yaml").read_text() == "lr: 0.1\n"
    assert not (dest / "data").exists()
    config = (dest / "trainwarden.toml").read_text()
    assert f'"--data", "{src / "data"}", "--cfg=conf/a.yaml"' in config, config


def test_a_branch_whose_trainer_script_is_missing_is_refused(src: Path, tmp_path: Path):
    set_command(src, ["python3", "-u", "train.py"])
    one_line_refusal(branch(src, tmp_path / "dest"), 2, "the script train.py does not exist in")
    assert not (tmp_path / "dest").exists()
    no_leftovers(tmp_path)


def test_unknown_step_is_refused(src: Path, tmp_path: Path):
    line = one_line_refusal(
        branch(src, tmp_path / "dest", "--step", 15), 2, "no checkpoint of step 15"
    )
    assert "10, 20, 30" in line
    assert not (tmp_path / "dest").exists()


def test_existing_destination_is_refused(src: Path, tmp_path: Path):
    dest = tmp_path / "dest"
    dest.mkdir()
    one_line_refusal(branch(src, dest), 2, "already exists")
    assert list(dest.iterdir()) == []


def test_destination_inside_the_source_is_refused(src: Path, tmp_path: Path):
    before = sorted(p.name for p in src.iterdir())
    one_line_refusal(branch(src, src / "audit"), 2, "is inside")
    assert sorted(p.name for p in src.iterdir()) == before


def test_source_that_is_no_run_is_refused(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    one_line_refusal(branch(tmp_path / "empty", tmp_path / "dest"), 2, "is not a run")
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--set", "trainer.stall_timeout_s=3"], "unknown key 'trainer.stall_timeout_s'"),
        (["--set", "restart.stall_timeout_s=soon"], "expected a number"),
        (["--set", "nosuchtable.key=1"], "unknown table [nosuchtable]"),
        (["--set", "restart"], "expected SECTION.KEY=VALUE"),
        (["--set", "checkpoints.format=torch-pt"], "keeps its parent's checkpoint format"),
        (["--cap", "docs=2"], "outside [0, 1]"),
        (["--cap", "nosuch=0.5"], "unknown arm 'nosuch'"),
        (["--floor", "docs=0.7", "--floor", "code=0.7"], "floors sum to 1.4"),
        (["--cap", "docs"], "expected ARM=NUMBER"),
    ],
)
def test_bad_overrides_are_refused(src: Path, tmp_path: Path, args: list[str], words: str):
    line = one_line_refusal(branch(src, tmp_path / "dest", *args), 2, words)
    assert ".branching" not in line
    assert not (tmp_path / "dest").exists()
    no_leftovers(tmp_path)


def test_quarantined_checkpoint_is_refused(src: Path, tmp_path: Path):
    """Step 20 corrupted: the next daemon start quarantines it; a branch from it refuses."""
    bad = src / "checkpoints" / "step_000020.bin"
    with open(bad, "r+b") as f:
        f.truncate(100)
    with running_daemon(src) as daemon:
        wait_for(lambda: (src / "checkpoints" / "quarantine").is_dir(), 60, what="quarantine")
        daemon.wait_state("finished", "running", timeout=120)
        daemon.stop()
    assert any(r.get("kind") == "quarantine" for r in journal(src))
    one_line_refusal(branch(src, tmp_path / "dest", "--step", 20), 1, "is quarantined")
    assert not (tmp_path / "dest").exists()


def test_unverified_checkpoint_is_refused_and_skipped(src: Path, tmp_path: Path):
    """A step-40 file no daemon has seen, that fails verification now: refused when named,
    passed over for the newest verified one otherwise."""
    planted = src / "checkpoints" / "step_000040.bin"
    planted.write_bytes(b"\x28\x00\x00\x00\x05\x00\x00\x00" + b"\x00" * 12)
    one_line_refusal(branch(src, tmp_path / "dest", "--step", 40), 1, "is not verified")
    assert not (tmp_path / "dest").exists()
    done = branch(src, tmp_path / "dest", "--json")
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["step"] == 30


def test_checkpoint_changed_since_its_commit_is_refused(src: Path, tmp_path: Path):
    ckpt = src / "checkpoints" / "step_000030.bin"
    data = bytearray(ckpt.read_bytes())
    data[-1] ^= 0xFF  # still verifies (size and header), but is not what was committed
    ckpt.write_bytes(bytes(data))
    one_line_refusal(branch(src, tmp_path / "dest", "--step", 30), 1, "has changed since")
    assert not (tmp_path / "dest").exists()


# ----------------------------------------------------------------------------- inherited history


def write_history(run_dir: Path, rows: list[tuple[int, float, int]]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        orjson.dumps({"step": s, "loss": loss, "dt": 0.1, "t": 1.0, "seg": seg})
        for s, loss, seg in rows
    ]
    (run_dir / ".loss.json").write_bytes(b"\n".join(lines) + b"\n")


def test_history_of_a_branch_of_a_branch(tmp_path: Path):
    """Root 1..100 (steps 41..60 replayed after a restart), child branched at 50 with
    51..80, grandchild branched at 70 with 71..: the grandchild inherits the root's 1..50
    (newest segment) and the child's 51..70."""
    root, child, grand = tmp_path / "root", tmp_path / "child", tmp_path / "grand"
    write_history(
        root,
        [(s, 1000.0 + s, 1) for s in range(1, 61)] + [(s, 2000.0 + s, 2) for s in range(41, 101)],
    )
    write_history(child, [(s, 3000.0 + s, 1) for s in range(51, 81)])
    write_history(grand, [(s, 4000.0 + s, 1) for s in range(71, 76)])
    write_branch(child, BranchInfo(root, 50, "step_000050.bin", "d"))
    write_branch(grand, BranchInfo(child, 70, "step_000070.bin", "d"))

    got = inherited(grand, 71)
    assert got.branch_step == 70
    assert got.ancestors == [
        {"run": str(root), "through_step": 50},
        {"run": str(child), "through_step": 70},
    ]
    steps = [int(s) for part, _ in got.parts for s in part]
    values = [float(v) for _, part in got.parts for v in part]
    assert steps == list(range(1, 71))
    assert values[:40] == [1000.0 + s for s in range(1, 41)]
    assert values[40:50] == [2000.0 + s for s in range(41, 51)]
    assert values[50:] == [3000.0 + s for s in range(51, 71)]

    # A parent out of reach: the branch still says where it branched, inherits nothing.
    os.rename(child, tmp_path / "moved")
    gone = inherited(grand, 71)
    assert gone.branch_step == 70 and gone.ancestors == [] and gone.parts == []
    # A run that is no branch inherits nothing either.
    assert inherited(root, 1).branch_step is None


def test_branch_that_replayed_its_branch_step_keeps_its_own(tmp_path: Path):
    parent, kid = tmp_path / "parent", tmp_path / "kid"
    write_history(parent, [(s, float(s), 1) for s in range(1, 21)])
    write_history(kid, [(s, -float(s), 1) for s in range(15, 25)])
    write_branch(kid, BranchInfo(parent, 20, "step_000020.bin", "d"))
    assert ancestry_key(kid, 21) == ancestry_key(kid, None) != ancestry_key(kid, 15)
    got = inherited(kid, 15)  # its trainer started before the branch step
    assert [int(s) for part, _ in got.parts for s in part] == list(range(1, 15))
    assert got.ancestors == [{"run": str(parent), "through_step": 14}]


def test_daemon_history_reply_of_a_run_that_is_no_branch(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "20", "--save-every", "10")
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=240)
        reply = daemon.request("history", points=100)
        daemon.stop()
    assert reply["branch_step"] is None and reply["ancestors"] == []
    assert reply["step"][0] == 1


def test_a_set_value_is_one_toml_value_and_a_huge_integer_is_one_line():
    from trainwarden.supervisor.cli.branch import parse_sets
    from trainwarden.supervisor.errors import UsageError

    assert parse_sets(["restart.stall_timeout_s=300", "run.name=plain text"]) == {
        "restart.stall_timeout_s": 300,
        "run.name": "plain text",
    }
    with pytest.raises(UsageError, match=r"one TOML value.*also sets trainer"):
        parse_sets(['run.name="x"\n[trainer]\ncommand = ["evil"]'])
    with pytest.raises(UsageError, match="more than 4,300 digits"):
        parse_sets(["checkpoints.keep_last=" + "9" * 5000])
