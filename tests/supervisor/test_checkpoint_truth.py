"""Committed checkpoints stay what they were at their commit, against a real daemon: a file
changed afterwards (in place, while the daemon runs or while none does) or planted far in
the future is quarantined, never resumed from, and the mirror keeps its good copy."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.support import journal, running_daemon, scripted_run, wait_for
from trainwarden.supervisor.store.mirror import Mirror, step_dir_name

N_PARAMS = 1000
WEIGHTS_AT = 8  # after the int32 step and int32 n_params of the header


def records(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


def rewrite_in_place(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes of a file where it is: same inode, same size, no rename."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    assert path.stat().st_size == size


@pytest.mark.timeout(240)
def test_a_checkpoint_rewritten_in_place_is_quarantined_and_the_mirror_keeps_its_copy(
    tmp_path: Path,
):
    backup = tmp_path / "backup"
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps", "400", "--save-every", "10", "--dt", "0.1",
        "--n-params", str(N_PARAMS),
        checkpoints={"keep_last": 3},
        mirror={"path": str(backup), "keep_last": 3},
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        mirrored = wait_for(
            lambda: [r for r in records(run_dir, "mirrored") if r["step"] >= 20],
            120,
            what="a checkpoint mirrored",
        )
        step = mirrored[0]["step"]
        path = run_dir / "checkpoints" / f"step_{step:06d}.bin"
        original = path.read_bytes()
        # 2,000 weights doubled, or here: zeros become 2.0 (finite: only the digest can tell).
        rewrite_in_place(path, WEIGHTS_AT, struct.pack("<f", 2.0) * 500)
        changed = wait_for(
            lambda: [r for r in records(run_dir, "checkpoint_changed") if r["step"] == step],
            30,
            what="the rewrite seen",
        )
        quarantined = wait_for(
            lambda: [r for r in records(run_dir, "quarantine") if r["step"] == step],
            30,
            what="the rewritten checkpoint quarantined",
        )
        assert changed[0]["was_verified"]
        assert quarantined[0]["reason"].startswith("content changed since commit")
        assert not path.exists()
        assert (run_dir / "checkpoints" / "quarantine" / path.name).exists()
        # Never counted as a new commit, and the mirror's copy of the good bytes stays.
        commits = [r for r in records(run_dir, "checkpoint") if r["step"] == step]
        assert len(commits) == 1
        assert not [r for r in records(run_dir, "mirror_retracted") if r["step"] == step]
        copy = backup / step_dir_name(step) / "checkpoint" / path.name
        if step in Mirror(backup, run_dir=run_dir).steps():  # not pruned by newer copies yet
            assert copy.read_bytes() == original
        # The run goes on, and no trainer is ever started from it.
        daemon.request("shutdown", timeout=60)
    spawns = [r for r in records(run_dir, "spawn") if r.get("resume")]
    assert all(r["resume"]["step"] != step for r in spawns)


@pytest.mark.timeout(240)
def test_changes_made_while_no_daemon_ran_are_caught_at_start_up(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps", "30", "--save-every", "10", "--n-params", str(N_PARAMS),
        checkpoints={"keep_last": 3},
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=120)
        wait_for(lambda: len(records(run_dir, "checkpoint")) >= 3, 30, what="three commits")
        daemon.request("shutdown", timeout=60)
        daemon.wait_exit(60)
    directory = run_dir / "checkpoints"
    # One bit flipped in step 30's weights (a tiny finite number), and a planted file far
    # in the future with a valid header and finite numbers.
    rewrite_in_place(directory / "step_000030.bin", WEIGHTS_AT + 1, b"\x01")
    planted = directory / "step_99999999.bin"
    planted.write_bytes(struct.pack("<ii", 99_999_999, N_PARAMS) + bytes(12 * N_PARAMS))
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: len(records(run_dir, "daemon_start")) == 2, 30, what="second start")
        quarantined = wait_for(
            lambda: (
                {r["name"]: r["reason"] for r in records(run_dir, "quarantine")}
                if len(records(run_dir, "quarantine")) >= 2
                else None
            ),
            30,
            what="both quarantined",
        )
        assert "content changed since commit" in quarantined["step_000030.bin"]
        assert "max_step_jump" in quarantined["step_99999999.bin"]
        view = daemon.request("checkpoints")
        assert [c["step"] for c in view["checkpoints"]] == [10, 20]
        daemon.request("shutdown", timeout=60)
