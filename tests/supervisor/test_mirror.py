"""The mirror against real files: verified copies, the pointer, retention, failures."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import orjson
import pytest
import xxhash

from trainwarden.supervisor.core.policy import mirror_deletions
from trainwarden.supervisor.store import mirror as mirror_module
from trainwarden.supervisor.store.mirror import Mirror
from trainwarden.supervisor.store.mirror_files import (
    LATEST,
    MANIFEST,
    MirrorError,
    read_pointer,
    step_dir_name,
)

pytestmark = pytest.mark.timeout(60)


def xxh(path: Path) -> str:
    return xxhash.xxh3_128(path.read_bytes()).hexdigest()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "trainwarden.toml").write_text('[trainer]\ncommand = ["python", "train.py"]\n')
    (run / "policy.json").write_text('{"caps": {"web": 0.5}}\n')
    return run


def checkpoint(run_dir: Path, step: int, size: int = 300_000) -> list[Path]:
    main = run_dir / "checkpoints" / f"step_{step:06d}.bin"
    main.write_bytes(os.urandom(size))
    sidecar = main.with_suffix(".json")
    sidecar.write_text(orjson.dumps({"step": step}).decode())
    return [main, sidecar]


def make_mirror(tmp_path: Path, run_dir: Path) -> Mirror:
    return Mirror(
        tmp_path / "backup",
        run_dir=run_dir,
        format_name="andrea-bin",
        chunk_bytes=64 * 1024,
    )


async def test_a_copy_is_verified_then_the_pointer_moves(tmp_path: Path, run_dir: Path):
    files = checkpoint(run_dir, 100)
    mirror = make_mirror(tmp_path, run_dir)
    result = await mirror.copy(100, files)
    assert result.ok and result.error is None
    root = tmp_path / "backup"
    pointer = orjson.loads((root / LATEST).read_bytes())
    assert pointer["step"] == 100 and pointer["dir"] == step_dir_name(100)
    assert pointer["name"] == "step_000100.bin" and pointer["format"] == "andrea-bin"
    listed = {f["name"]: f for f in pointer["files"]}
    assert set(listed) == {
        "checkpoint/step_000100.bin", "checkpoint/step_000100.json",
        "run/trainwarden.toml", "run/policy.json",
    }  # fmt: skip
    step_dir = root / step_dir_name(100)
    for source, name in (
        (files[0], "checkpoint/step_000100.bin"),
        (run_dir / "policy.json", "run/policy.json"),
    ):
        copy = step_dir / name
        assert copy.read_bytes() == source.read_bytes()
        assert (
            listed[name]["xxh3_128"] == xxh(source)
            and listed[name]["bytes"] == source.stat().st_size
        )
    assert orjson.loads((step_dir / MANIFEST).read_bytes())["files"] == pointer["files"]
    assert result.bytes == sum(f["bytes"] for f in pointer["files"])
    assert len(result.files) == 4
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


async def test_folders_are_copied_whole(tmp_path: Path, run_dir: Path):
    folder = run_dir / "checkpoints" / "checkpoint-200"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(5000))
    (folder / "trainer_state.json").write_text('{"global_step": 200}')
    (folder / "sub" / "extra.bin").write_bytes(b"x" * 10)
    result = await make_mirror(tmp_path, run_dir).copy(200, [folder])
    assert result.ok
    names = sorted(f.name for f in result.files if f.name.startswith("checkpoint/"))
    assert names == [
        "checkpoint/checkpoint-200/model.safetensors",
        "checkpoint/checkpoint-200/sub/extra.bin",
        "checkpoint/checkpoint-200/trainer_state.json",
    ]
    copied = tmp_path / "backup" / step_dir_name(200) / "checkpoint" / "checkpoint-200"
    assert (copied / "sub" / "extra.bin").read_bytes() == b"x" * 10


async def test_retention_keeps_the_newest_and_never_the_pointer(tmp_path: Path, run_dir: Path):
    mirror = make_mirror(tmp_path, run_dir)

    async def copy_and_prune(step: int, keep_last: int) -> list[int]:
        """One copy, then what the policy decides after it, carried out."""
        result = await mirror.copy(step, checkpoint(run_dir, step, 1000))
        assert result.ok and result.mirrored == tuple(mirror.steps())
        doomed = mirror_deletions(result.mirrored, result.step, keep_last)
        return await mirror.prune(doomed)

    for step in (10, 20, 30):
        removed = await copy_and_prune(step, keep_last=2)
    assert removed == [10]
    assert mirror.steps() == [20, 30]
    # After a rollback the run commits an older step than the mirror's newest: keep_last
    # alone would delete it, but latest.json names it.
    assert await copy_and_prune(25, keep_last=1) == [20]
    assert mirror.steps() == [25, 30] and read_pointer(tmp_path / "backup").step == 25
    # Pruning never takes the step latest.json names, even when told to.
    assert await mirror.prune([25, 30]) == [30]
    assert mirror.steps() == [25] and read_pointer(tmp_path / "backup").step == 25


async def test_an_unwritable_mirror_fails_without_touching_the_run(tmp_path: Path, run_dir: Path):
    files = checkpoint(run_dir, 100)
    before = {p: p.read_bytes() for p in files}
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the mirror folder should be")
    mirror = Mirror(blocker / "backup", run_dir=run_dir)
    result = await mirror.copy(100, files)
    assert not result.ok and "backup" in (result.error or "")
    assert {p: p.read_bytes() for p in files} == before


async def test_a_source_that_changes_mid_copy_leaves_the_pointer_alone(
    tmp_path: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    mirror = make_mirror(tmp_path, run_dir)
    assert (await mirror.copy(100, checkpoint(run_dir, 100))).ok
    pointer_before = (tmp_path / "backup" / LATEST).read_bytes()
    files = checkpoint(run_dir, 200)
    real_copy = mirror_module.copy_hashed

    def copy_then_trainer_writes(source: Path, target: Path, *args: object) -> tuple[str, int]:
        digest = real_copy(source, target, *args)  # type: ignore[arg-type]
        if source == files[0]:
            with open(source, "r+b") as f:  # the trainer rewrites the file under us
                f.seek(1000)
                f.write(b"\xff" * 16)
        return digest

    monkeypatch.setattr(mirror_module, "copy_hashed", copy_then_trainer_writes)
    result = await mirror.copy(200, files)
    assert not result.ok
    assert "step_000200.bin: hash mismatch" in (result.error or "")
    assert "changed while it was copied" in (result.error or "")
    assert (tmp_path / "backup" / LATEST).read_bytes() == pointer_before
    assert mirror.steps() == [100]
    assert not [p for p in (tmp_path / "backup").iterdir() if p.name.startswith(".incoming")]


async def test_a_copy_that_reads_back_wrong_is_refused(
    tmp_path: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    real_copy = mirror_module.copy_hashed

    def copy_then_bit_rot(source: Path, target: Path, *args: object) -> tuple[str, int]:
        digest = real_copy(source, target, *args)  # type: ignore[arg-type]
        data = bytearray(target.read_bytes())
        data[-1] ^= 1
        target.write_bytes(bytes(data))
        return digest

    monkeypatch.setattr(mirror_module, "copy_hashed", copy_then_bit_rot)
    result = await make_mirror(tmp_path, run_dir).copy(100, checkpoint(run_dir, 100))
    assert not result.ok and "reads back as" in (result.error or "")
    assert not (tmp_path / "backup" / LATEST).exists()


async def test_a_source_that_vanishes_is_a_failure(tmp_path: Path, run_dir: Path):
    files = checkpoint(run_dir, 100)
    files[1].unlink()
    result = await make_mirror(tmp_path, run_dir).copy(100, files)
    assert not result.ok and "vanished during the copy" in (result.error or "")


async def test_a_newer_checkpoint_supersedes_the_waiting_ones(
    tmp_path: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    mirror = make_mirror(tmp_path, run_dir)
    release = threading.Event()
    started = threading.Event()
    real_copy = mirror_module.copy_hashed

    def slow_first(source: Path, target: Path, *args: object) -> tuple[str, int]:
        if "step_000100" in source.name:
            started.set()
            release.wait(10)
        return real_copy(source, target, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(mirror_module, "copy_hashed", slow_first)
    first = asyncio.ensure_future(mirror.copy(100, checkpoint(run_dir, 100, 1000)))
    await asyncio.to_thread(started.wait, 10)
    second = asyncio.ensure_future(mirror.copy(200, checkpoint(run_dir, 200, 1000)))
    third = asyncio.ensure_future(mirror.copy(300, checkpoint(run_dir, 300, 1000)))
    await asyncio.sleep(0.05)
    release.set()
    results = await asyncio.gather(first, second, third)
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].superseded_by == 300
    assert mirror.steps() == [100, 300]
    assert read_pointer(tmp_path / "backup").step == 300


async def test_retract_moves_the_pointer_back(tmp_path: Path, run_dir: Path):
    mirror = make_mirror(tmp_path, run_dir)
    for step in (100, 200, 300):
        assert (await mirror.copy(step, checkpoint(run_dir, step, 1000))).ok
    assert await mirror.retract(200) == 300  # not the pointer: only its copy goes
    assert mirror.steps() == [100, 300]
    assert await mirror.retract(300) == 100
    pointer = read_pointer(tmp_path / "backup")
    assert pointer.step == 100 and pointer.files[0].name == "checkpoint/step_000100.bin"
    assert await mirror.retract(100) is None
    assert not (tmp_path / "backup" / LATEST).exists() and mirror.steps() == []


async def test_leftovers_of_an_interrupted_copy_are_cleared(tmp_path: Path, run_dir: Path):
    leftover = tmp_path / "backup" / ".incoming-step-000000050"
    leftover.mkdir(parents=True)
    (leftover / "half.bin").write_bytes(b"\0" * 10)
    result = await make_mirror(tmp_path, run_dir).copy(100, checkpoint(run_dir, 100, 1000))
    assert result.ok and not leftover.exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "missing"),
        (b"{not json", "corrupt"),
        (b'{"step": 1, "dir": "../../etc", "files": [{"name": "a", "bytes": 1, "xxh3_128": "0"}]}', "corrupt"),
        (b'{"step": 1, "dir": "step-000000001", "files": [{"name": "../x", "bytes": 1, "xxh3_128": "0"}]}', "corrupt"),
        (b'{"step": "x", "dir": "step-000000001", "files": []}', "corrupt"),
    ],
    ids=["missing", "not-json", "escaping-dir", "escaping-file", "bad-step"],
)  # fmt: skip
def test_bad_pointers_are_refused(tmp_path: Path, content: bytes | None, expected: str):
    tmp_path.mkdir(exist_ok=True)
    if content is not None:
        (tmp_path / LATEST).write_bytes(content)
    with pytest.raises(MirrorError, match=expected):
        read_pointer(tmp_path)


async def test_close_interrupts_a_copy_and_keeps_the_pointer(
    tmp_path: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    mirror = make_mirror(tmp_path, run_dir)
    assert (await mirror.copy(100, checkpoint(run_dir, 100, 1000))).ok
    assert mirror.newest_step() == 100
    real_hash = mirror_module.hash_file

    def close_while_hashing(path: Path, *args: object) -> tuple[str, int]:
        mirror.close()  # SIGTERM to the daemon arrives in the middle of a copy
        return real_hash(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(mirror_module, "hash_file", close_while_hashing)
    result = await mirror.copy(200, checkpoint(run_dir, 200, 200_000))
    assert not result.ok and "interrupted" in (result.error or "")
    assert mirror.newest_step() == 100 and mirror.steps() == [100]
    assert not (await mirror.copy(300, checkpoint(run_dir, 300, 1000))).ok


# ----------------------------------------------------------------------------- under the daemon


@pytest.mark.timeout(180)
def test_the_daemon_mirrors_each_checkpoint_and_restore_rebuilds_the_run(tmp_path: Path):
    import subprocess

    from tests.support import PYTHON, journal, running_daemon, scripted_run, wait_for

    backup = tmp_path / "backup"
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps",
        "30",
        "--save-every",
        "10",
        run={"name": "mirrored"},
        checkpoints={"keep_last": 2},
        mirror={"path": str(backup), "keep_last": 2},
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=120)
        wait_for(
            lambda: any(r["kind"] == "mirrored" and r["step"] == 30 for r in journal(run_dir)),
            60,
            what="step 30 mirrored",
        )
        mirrored = [r for r in journal(run_dir) if r["kind"] == "mirrored"]
        # The newest two copies stay. On a busy machine a copy still waiting when a newer
        # checkpoint came is superseded by it (`mirror_superseded`: 20 may never be copied),
        # so the two are the newest of those mirrored. The prune after the last copy runs in
        # the background, after its `mirrored` record: waited for while the daemon lives
        # (the block's end kills it).
        kept = sorted({r["step"] for r in mirrored})[-2:]
        wait_for(
            lambda: Mirror(backup, run_dir=run_dir).steps() == kept, 30, what=f"pruned to {kept}"
        )
    assert [r["step"] for r in mirrored][-1] == 30 and 30 in kept
    assert not [r for r in journal(run_dir) if r["kind"] == "mirror_failed"]
    pointer = read_pointer(backup)
    assert pointer.step == 30 and pointer.format == "andrea-bin"
    local = run_dir / "checkpoints" / "step_000030.bin"
    copy = backup / step_dir_name(30) / "checkpoint" / "step_000030.bin"
    assert copy.read_bytes() == local.read_bytes()

    new = tmp_path / "new-machine"
    done = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "restore", str(new), "--from", str(backup)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("restored step 30")
    assert (new / "checkpoints" / "step_000030.bin").read_bytes() == local.read_bytes()
    assert (new / "trainwarden.toml").read_text() == (run_dir / "trainwarden.toml").read_text()
    again = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "restore", str(new), "--from", str(backup)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1 and "already holds step 30" in again.stderr


@pytest.mark.timeout(180)
def test_a_failing_mirror_is_journaled_and_the_run_goes_on(tmp_path: Path):
    from tests.support import checkpoints, journal, running_daemon, scripted_run

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps",
        "30",
        "--save-every",
        "10",
        run={"name": "mirrored"},
        checkpoints={"keep_last": 2},
        mirror={"path": str(blocker / "backup")},
        divergence={"rollback_steps": 10},  # the two kept span it: retention keeps two
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=120)
    failures = [r for r in journal(run_dir) if r["kind"] == "mirror_failed"]
    assert failures and "backup" in failures[0]["error"]
    assert checkpoints(run_dir) == [20, 30]


@pytest.mark.timeout(180)
def test_a_mirror_serves_one_run_and_restore_installs_only_that_run(tmp_path: Path):
    """Run A mirrors into `shared`; run B configured with the same path is refused at
    start in one line (it would evict A's copies). Restoring into B from A's mirror is
    refused too; a new folder restored from it becomes run A again (its id), whose daemon
    the mirror accepts."""
    import subprocess

    from tests.support import PYTHON, journal, running_daemon, scripted_run, wait_for
    from trainwarden.supervisor.cli.start_checks import check_mirror_owner
    from trainwarden.supervisor.config import load_config
    from trainwarden.supervisor.store.identity import read_owner, read_run_id

    shared = tmp_path / "shared"

    def a_run(name: str) -> Path:
        return scripted_run(
            tmp_path / name,
            *("--steps", "20", "--save-every", "10"),
            run={"name": name},
            mirror={"path": str(shared)},
        )

    def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    a = a_run("a")
    with running_daemon(a) as daemon:
        daemon.wait_state("finished", timeout=120)
        wait_for(lambda: any(r["kind"] == "mirrored" and r["step"] == 20 for r in journal(a)), 60)
    owner = read_owner(shared)
    assert owner is not None and owner.run_id == read_run_id(a) and owner.name == "a"
    b = a_run("b")
    refused = cli("daemon", b)
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert f"it is the mirror of run 'a' ({os.path.realpath(a)})" in line, line
    assert read_owner(shared) == owner and not (b / "checkpoints").exists()

    into_b = cli("restore", b, "--from", shared)
    assert into_b.returncode == 2 and "is the mirror of run 'a'" in into_b.stderr
    assert not (b / "checkpoints").exists()

    new = tmp_path / "new-machine"
    restored = cli("restore", new, "--from", shared)
    assert restored.returncode == 0, restored.stderr
    assert read_run_id(new) == owner.run_id
    check_mirror_owner(load_config(new))  # the same run: accepted
