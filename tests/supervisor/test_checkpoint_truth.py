"""Committed checkpoints stay what they were at their commit, against a real daemon: a file
changed afterwards (in place, while the daemon runs or while none does) or planted far in
the future is quarantined, never resumed from, and the mirror keeps its good copy."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tests.support import journal, running_daemon, scripted_run, wait_for
from trainwarden.supervisor.store.mirror import Mirror
from trainwarden.supervisor.store.mirror_files import step_dir_name

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
        f.flush()
        # Through the descriptor: the daemon may have moved the file away already.
        assert os.fstat(f.fileno()).st_size == size


@pytest.mark.timeout(240)
def test_a_checkpoint_rewritten_in_place_is_quarantined_and_the_mirror_keeps_its_copy(
    tmp_path: Path,
):
    backup = tmp_path / "backup"
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps", "400", "--save-every", "10", "--dt", "0.2",
        "--n-params", str(N_PARAMS),
        checkpoints={"keep_last": 5},
        mirror={"path": str(backup), "keep_last": 5},
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        mirrored = wait_for(
            lambda: [r for r in records(run_dir, "mirrored") if r["step"] >= 20],
            120,
            what="a checkpoint mirrored",
        )
        step = mirrored[-1]["step"]  # the newest: retention keeps it for 10 s at least
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
        # The journal says so before the move (a thread's work) is done: wait for both.
        wait_for(lambda: not path.exists(), 30, what="the rewritten checkpoint moved away")
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


@pytest.mark.timeout(240)
def test_a_plant_within_max_step_jump_evicts_no_real_checkpoint_until_the_steps_reach_it(
    tmp_path: Path,
):
    """keep_last = 1; a valid checkpoint for step 110 planted while the trainer logs step
    ~85 (within max_step_jump, so it counts as a commit): retention deletes neither the
    real 90 nor the real 100 for it as they commit."""
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps", "300", "--save-every", "10", "--n-params", str(N_PARAMS), "--dt", "0.1",
        checkpoints={"keep_last": 1, "max_step_jump": 100},
        divergence={"spikes": False},  # keep_last alone, no rollback rungs (test_spikes)
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status()["step"] or 0) >= 82, 60, what="step 82")
        planted = run_dir / "checkpoints" / "step_000110.bin"
        planted.write_bytes(struct.pack("<ii", 110, N_PARAMS) + bytes(12 * N_PARAMS))
        wait_for(lambda: any(r["step"] == 100 for r in records(run_dir, "checkpoint")), 60)
        listed = wait_for(
            lambda: (
                (s := [c["step"] for c in daemon.request("checkpoints")["checkpoints"]])
                and 100 in s
                and s
            ),
            30,
            what="100 listed",
        )
        assert listed == [100, 110], listed
        deleted = [r["step"] for r in records(run_dir, "delete")]
        assert 100 not in deleted and 110 not in deleted, deleted
        assert not records(run_dir, "quarantine")


SLOW_PROBE = """#!{python}
# The torch-pt verifier's interpreter, slowed: each torch.load takes {delay} s longer, so
# verifications lag behind commits as they do for large files on a busy machine.
import sys
import time

code = sys.argv[sys.argv.index("-c") + 1]
if "torch.load" in code:
    import torch

    real_load = torch.load

    def slow_load(*args, **kwargs):
        time.sleep({delay})
        return real_load(*args, **kwargs)

    torch.load = slow_load
sys.argv = ["-c"]
exec(compile(code, "<verifier>", "exec"), {{"__name__": "__main__"}})
"""


def torch_pt_steps(directory: Path) -> list[int]:
    return sorted(int(p.name[5:11]) for p in directory.glob("ckpt_*.pt"))


@pytest.mark.timeout(300)
def test_torch_pt_stop_start_and_save_name_the_checkpoint_actually_written(tmp_path: Path):
    """Commits every 0.4 s, each verification 0.6 s: replies still name what is on disk."""
    from tests.support import PYTHON, make_run

    slow = tmp_path / "slow-python"
    slow.write_text(SLOW_PROBE.format(python=PYTHON, delay=0.6))
    slow.chmod(0o755)
    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, str(Path(__file__).parents[1] / "format_trainer.py"),
         "--format", "torch-pt", "--steps", "100000", "--save-every", "20", "--dt", "0.02"],
        run={"name": "lagging"},
        trainer={"stop_timeout_s": 30.0},
        checkpoints={"format": "torch-pt", "keep_last": 3, "options": {"python": str(slow)}},
        restart={"backoff_initial_s": 0.0, "stall_timeout_s": 120.0},
    )  # fmt: skip
    directory = run_dir / "checkpoints"
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: len(records(run_dir, "checkpoint")) >= 2, 120, what="two commits")
        stopped = daemon.request("stop", timeout=120)
        on_disk = torch_pt_steps(directory)
        assert stopped["checkpoint"]["step"] == on_disk[-1], (stopped, on_disk)
        assert "unverified" not in stopped

        started = daemon.request("start", timeout=120)
        assert started["resume_step"] == on_disk[-1], (started, on_disk)
        spawn = records(run_dir, "spawn")[-1]
        assert spawn["resume"]["step"] == on_disk[-1]

        wait_for(lambda: (daemon.status().get("step") or 0) > on_disk[-1] + 5, 60, what="steps")
        asked = len(journal(run_dir))
        saved = daemon.request("save", timeout=120, wait=True)
        since = journal(run_dir)[asked:]
        (target,) = [r["step"] for r in since if r["kind"] == "save_requested"]
        later = [r["step"] for r in since if r["kind"] == "checkpoint"]
        # The first checkpoint at or after the save's step, whatever verified first.
        assert saved["step"] == min(s for s in later if s >= target), (saved, target, later)
        assert (directory / saved["name"]).exists() or saved["step"] < torch_pt_steps(directory)[0]
        daemon.request("shutdown", timeout=120)
    commits = [r["name"] for r in records(run_dir, "checkpoint")]
    assert len(commits) == len(set(commits))  # each checkpoint counted once


def test_a_checkpoint_saved_again_under_its_name_while_digested_is_a_new_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A trainer saves step 50, then on SIGTERM saves step 50 again (a new file renamed over
    the name) while the daemon digests the first: seen under load as a quarantine "written
    to while its digest was taken", losing the run's last checkpoint. The second file is a
    new commit, checked afresh; only a file written to in place is refused."""
    from trainwarden.plugins.formats.andrea_bin import AndreaBin
    from trainwarden.supervisor.core.policy import Outcome
    from trainwarden.supervisor.shell import verdicts
    from trainwarden.supervisor.store.checkpoints import CheckpointStore

    def andrea(step: int) -> bytes:
        return struct.pack("<ii", step, N_PARAMS) + bytes(12 * N_PARAMS)

    name = "step_000050.bin"
    path = tmp_path / name
    path.write_bytes(andrea(50))
    real_digest = verdicts.digest_checkpoint
    calls = []

    def digest_while_saved_again(paths):
        calls.append(1)
        if len(calls) == 1:
            staged = tmp_path / "step_000050.bin.tmp"
            staged.write_bytes(andrea(50))
            os.replace(staged, path)
        return real_digest(paths)

    monkeypatch.setattr(verdicts, "digest_checkpoint", digest_while_saved_again)
    reports = verdicts.CheckpointReports(
        CheckpointStore(tmp_path, AndreaBin()),
        None,  # type: ignore[arg-type]
        lambda event: None,
    )
    checked = reports.check(name)
    assert checked.verdict.outcome == Outcome.VERIFIED, checked.verdict.reason
    assert len(calls) == 2 and checked.digest is not None

    def write_in_place(paths):
        with open(path, "r+b") as f:
            f.seek(WEIGHTS_AT)
            f.write(struct.pack("<f", 2.0))
        return real_digest(paths)

    # Written to in place at every read: refused once it has not stood still in time.
    monkeypatch.setattr(verdicts, "STILL_WITHIN_S", 1.0)
    monkeypatch.setattr(verdicts, "digest_checkpoint", write_in_place)
    refused = reports.check(name)
    assert refused.verdict.outcome == Outcome.INVALID
    assert refused.verdict.reason == "written to while its digest was taken"


def test_a_folder_another_rank_still_writes_into_is_read_again_once_it_stands_still(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Under torchrun, rank 0 closed checkpoint-11/trainer_state.json (the folder's commit)
    while rank 1 still wrote its rng_state_1.pth: the digest saw the folder change and the
    stop's own checkpoint was quarantined ("written to while its digest was taken"), the
    stop reported "exited without saving". The folder is read again, and verified again,
    once its files stand still; the digest is the finished folder's."""
    import numpy as np
    from safetensors.numpy import save_file

    from trainwarden.plugins.formats.hf_trainer import HfTrainer
    from trainwarden.supervisor.core.policy import Outcome
    from trainwarden.supervisor.shell import verdicts
    from trainwarden.supervisor.store.checkpoints import CheckpointStore
    from trainwarden.supervisor.store.digest import digest_checkpoint

    folder = tmp_path / "checkpoint-11"
    folder.mkdir()
    save_file({"w": np.zeros(1024, np.float32)}, str(folder / "model.safetensors"))
    for other in ("optimizer.pt", "scheduler.pt", "rng_state_0.pth"):
        (folder / other).write_bytes(b"z" * 64)
    (folder / "trainer_state.json").write_text('{"global_step": 11}')
    rank1 = folder / "rng_state_1.pth"
    rank1.write_bytes(b"x" * 100)
    real_digest = verdicts.digest_checkpoint
    reads = []

    def rank_1_still_writing(paths):
        reads.append(1)
        if len(reads) == 1:
            with open(rank1, "ab") as f:
                f.write(b"y" * 1000)
        return real_digest(paths)

    monkeypatch.setattr(verdicts, "digest_checkpoint", rank_1_still_writing)
    store = CheckpointStore(tmp_path, HfTrainer())
    reports = verdicts.CheckpointReports(store, None, lambda event: None)  # type: ignore[arg-type]
    checked = reports.check("checkpoint-11")
    assert checked.verdict.outcome == Outcome.VERIFIED, checked.verdict.reason
    assert len(reads) == 2
    assert checked.digest == digest_checkpoint(store.files_of("checkpoint-11"))
