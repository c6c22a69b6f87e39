"""`restore`: a run directory rebuilt from its mirror, with every refusal it owes."""

from __future__ import annotations

import os
import random
import struct
from array import array
from pathlib import Path

import orjson
import pytest

from tests.format_trainer import save_hf_trainer
from trainwarden.plugins.formats.andrea_bin import checkpoint_name
from trainwarden.supervisor.errors import LockHeld, TrainwardenError, UsageError
from trainwarden.supervisor.registry import checkpoint_format
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.mirror import Mirror
from trainwarden.supervisor.store.mirror_files import LATEST, step_dir_name
from trainwarden.supervisor.store.restore import restore
from trainwarden.supervisor.store.rundir import RunFiles, acquire_lock

pytestmark = pytest.mark.timeout(60)

CONFIG = '[run]\nname = "mirrored"\n[trainer]\ncommand = ["python", "-m", "trainwarden.trainer"]\n'


def write_checkpoint(directory: Path, step: int, n_params: int = 50) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / checkpoint_name(step)
    # Finite weights and moments, v >= 0: what verification accepts (random in [0, 1)).
    values = array("f", (random.random() for _ in range(3 * n_params)))
    path.write_bytes(struct.pack("<ii", step, n_params) + values.tobytes())
    sidecar = path.with_suffix(".json")
    sidecar.write_bytes(orjson.dumps({"step": step, "arm": "web"}))
    return [path, sidecar]


@pytest.fixture
def mirrored(tmp_path: Path) -> tuple[Path, Path]:
    """(the original run, its mirror) after mirroring steps 100 and 200."""
    run = tmp_path / "original"
    run.mkdir()
    (run / "trainwarden.toml").write_text(CONFIG)
    (run / "policy.json").write_text('{"caps": {"web": 0.4}}\n')
    mirror = Mirror(tmp_path / "backup", run_dir=run, format_name="andrea-bin")
    for step in (100, 200):
        result = mirror.copy_now(step, write_checkpoint(run / "checkpoints", step))
        assert result.ok, result.error
    return run, tmp_path / "backup"


def test_restore_recreates_the_run_on_a_new_machine(tmp_path: Path, mirrored: tuple[Path, Path]):
    original, backup = mirrored
    new = tmp_path / "new-machine" / "run"
    summary = restore(new, backup, config_from=None)
    assert summary.startswith("restored step 200 (4 files,")
    assert "\n" not in summary and f"trainwarden daemon {new}" in summary
    for name in (checkpoint_name(200), "step_000200.json"):
        assert (new / "checkpoints" / name).read_bytes() == (
            original / "checkpoints" / name
        ).read_bytes()
    assert (new / "trainwarden.toml").read_text() == CONFIG
    assert (new / "policy.json").read_text() == (original / "policy.json").read_text()
    store = CheckpointStore(new / "checkpoints", checkpoint_format("andrea-bin"))
    assert store.scan() == ([checkpoint_name(200)], [])
    assert store.verify(checkpoint_name(200)).info is not None
    assert not list((new / ".trainwarden").glob("restore-*"))


def test_an_existing_config_and_policy_are_kept(tmp_path: Path, mirrored: tuple[Path, Path]):
    _, backup = mirrored
    new = tmp_path / "run"
    new.mkdir()
    own = CONFIG.replace("mirrored", "mine")
    (new / "trainwarden.toml").write_text(own)
    (new / "policy.json").write_text("{}\n")
    summary = restore(new, backup)
    assert "kept the existing policy.json" in summary
    assert (new / "trainwarden.toml").read_text() == own
    assert (new / "policy.json").read_text() == "{}\n"
    with pytest.raises(UsageError, match="exists; remove it or drop --config"):
        other = tmp_path / "other.toml"
        other.write_text(CONFIG)
        restore(new, backup, config_from=other)


def test_a_config_from_elsewhere_is_installed(tmp_path: Path, mirrored: tuple[Path, Path]):
    _, backup = mirrored
    config = tmp_path / "new.toml"
    config.write_text(CONFIG + '[checkpoints]\ndir = "ckpts"\n')
    summary = restore(tmp_path / "run", backup, config_from=config)
    assert (tmp_path / "run" / "ckpts" / checkpoint_name(200)).is_file()
    assert f"trainwarden.toml from {config}" in summary


def test_a_pointer_behind_the_run_is_refused(tmp_path: Path, mirrored: tuple[Path, Path]):
    _, backup = mirrored
    new = tmp_path / "run"
    write_checkpoint(new / "checkpoints", 300)
    with pytest.raises(
        TrainwardenError, match="already holds step 300 .* newer than the mirror's step 200"
    ):
        restore(new, backup)
    assert sorted(p.name for p in (new / "checkpoints").iterdir()) == [
        checkpoint_name(300), "step_000300.json",
    ]  # fmt: skip
    restore(tmp_path / "again", backup)
    with pytest.raises(TrainwardenError, match="already holds step 200"):
        restore(tmp_path / "again", backup)


def test_a_damaged_mirror_copy_restores_nothing(tmp_path: Path, mirrored: tuple[Path, Path]):
    _, backup = mirrored
    copy = backup / step_dir_name(200) / "checkpoint" / checkpoint_name(200)
    data = bytearray(copy.read_bytes())
    data[100] ^= 0xFF
    copy.write_bytes(bytes(data))
    new = tmp_path / "run"
    with pytest.raises(TrainwardenError, match=f"{checkpoint_name(200)}: hash mismatch"):
        restore(new, backup)
    assert not (new / "checkpoints").exists() or not list((new / "checkpoints").iterdir())
    assert not (new / "trainwarden.toml").exists()
    assert not list((new / ".trainwarden").glob("restore-*"))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda b: (b / LATEST).unlink(), "latest.json: missing"),
        (lambda b: (b / LATEST).write_text('{"step": 2'), "latest.json: corrupt"),
        (lambda b: (b / step_dir_name(200) / "checkpoint" / "step_000200.json").unlink(),
         "missing from the mirror"),
    ],
    ids=["missing", "corrupt", "file-missing"],
)  # fmt: skip
def test_missing_or_corrupt_pointers_are_refused(tmp_path: Path, mirrored, damage, expected: str):
    _, backup = mirrored
    damage(backup)
    with pytest.raises(TrainwardenError, match=expected) as caught:
        restore(tmp_path / "run", backup)
    assert "\n" not in str(caught.value)


def test_a_running_daemon_blocks_restore(tmp_path: Path, mirrored: tuple[Path, Path]):
    _, backup = mirrored
    new = tmp_path / "run"
    new.mkdir()
    fd = acquire_lock(RunFiles(new))
    try:
        with pytest.raises(LockHeld):
            restore(new, backup)
    finally:
        os.close(fd)


def test_a_mirror_without_config_needs_one(tmp_path: Path):
    run = tmp_path / "original"
    mirror = Mirror(tmp_path / "backup", run_dir=run)
    assert mirror.copy_now(100, write_checkpoint(run / "checkpoints", 100)).ok
    with pytest.raises(UsageError, match="give one with --config FILE"):
        restore(tmp_path / "run", tmp_path / "backup")


def test_a_folder_checkpoint_is_restored_whole(tmp_path: Path):
    run = tmp_path / "original"
    (run / "checkpoints").mkdir(parents=True)
    (run / "trainwarden.toml").write_text(CONFIG + '[checkpoints]\nformat = "hf-trainer"\n')
    save_hf_trainer(run / "checkpoints", 400)
    mirror = Mirror(tmp_path / "backup", run_dir=run, format_name="hf-trainer")
    assert mirror.copy_now(400, [run / "checkpoints" / "checkpoint-400"]).ok
    new = tmp_path / "run"
    restore(new, tmp_path / "backup")
    restored = new / "checkpoints" / "checkpoint-400"
    assert sorted(p.name for p in restored.iterdir()) == sorted(
        p.name for p in (run / "checkpoints" / "checkpoint-400").iterdir()
    )
    assert checkpoint_format("hf-trainer").verify(restored).step == 400
