"""`trainwarden inspect` on the reference trainer's checkpoints, read without a daemon and
without torch: the andrea-bin layout to the byte, the digest against the one the daemon
journaled at the commit, the sidecar, a branch run's record, and every refusal of
`inspect` and `export` that needs no torch to reach (the torch side: tests/trainer/test_export.py)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support import PYTHON, journal, make_run, reference_run, running_daemon, wait_for
from trainwarden.supervisor.store.branches import BranchInfo, write_branch
from trainwarden.trainer.presets import PRESETS

TINY = PRESETS["tiny"]


def cli(*args: str, cwd: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """The command line in a child; `prelude` runs first (to hide torch, say)."""
    command = [PYTHON, "-m", "trainwarden.supervisor"]
    if prelude:
        command = [
            PYTHON,
            "-c",
            f"{prelude}; import sys; from trainwarden.supervisor.cli.main import main;"
            " sys.exit(main(sys.argv[1:]))",
        ]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def inspected(path: Path, *extra: str) -> dict:
    done = cli("inspect", str(path), "--json", *extra, cwd=path.parent)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def inspected_safetensors(path: Path) -> dict:
    """A safetensors file's tensor entries, read from its header."""
    data = path.read_bytes()
    header = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])
    header.pop("__metadata__", None)
    return header


@pytest.fixture(scope="module")
def supervised(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of the reference trainer under the daemon: step 10 and step 20
    committed, verified and digested in the journal."""
    run_dir = reference_run(tmp_path_factory.mktemp("inspect") / "run", 20, 10)
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished")
        wait_for(
            lambda: len([r for r in journal(run_dir) if r["kind"] == "checkpoint"]) == 2,
            60,
            what="both checkpoints journaled",
        )
    return run_dir


def copied_run(supervised: Path, tmp_path: Path) -> Path:
    """A copy of the supervised run (its journal included) for a test to damage."""
    run_dir = tmp_path / "run"
    shutil.copytree(supervised, run_dir, ignore=shutil.ignore_patterns("*.sock", "lock"))
    return run_dir


def test_inspect_reports_the_layout_to_the_byte_and_the_digest_the_daemon_recorded(
    supervised: Path,
):
    path = supervised / "checkpoints" / "step_000020.bin"
    report = inspected(path)
    print("inspect:", json.dumps(report, indent=1))

    assert (report["format"], report["step"], report["n_params"]) == (
        "andrea-bin",
        20,
        TINY.n_params,
    )
    assert report["weights_numel"] == TINY.n_params
    assert report["optimizer_numel"] == 2 * report["weights_numel"]  # Adam m and v
    assert report["optimizer_ratio"] == 2.0
    regions = report["regions"]
    assert [r["name"] for r in regions] == ["header", "weights", "exp_avg", "exp_avg_sq"]
    assert regions[0] == {"name": "header", "offset": 0, "bytes": 8}
    for before, after in zip(regions, regions[1:], strict=False):
        assert after["offset"] == before["offset"] + before["bytes"]
    assert all(r["bytes"] == 4 * TINY.n_params for r in regions[1:])
    assert sum(r["bytes"] for r in regions) == path.stat().st_size
    assert report["check"] == {"ok": True, "reason": None}

    recorded = [
        r["digest"] for r in journal(supervised) if r["kind"] == "checkpoint" and r["step"] == 20
    ]
    assert report["recorded_digest"] == recorded[-1]
    assert report["digest"] == recorded[-1] and report["digest_matches"] is True

    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert report["sidecar"]["data_fingerprint"] == sidecar["data_fingerprint"]
    pulls = report["sidecar"]["bandit"]["pulls"]
    assert pulls == {name: arm["pulls"] for name, arm in sidecar["bandit"]["arms"].items()}
    assert sum(pulls.values()) == 20  # one pull per step
    assert report["branch"] is None and report["unknown"] == []

    text = cli("inspect", str(path), cwd=supervised)
    assert text.returncode == 0, text.stderr
    assert f"optimizer   {2 * TINY.n_params:,} values (2 x the weights)" in text.stdout
    assert "(matches the commit)" in text.stdout


def test_a_run_directory_and_step_name_its_checkpoint(supervised: Path):
    assert inspected(supervised)["step"] == 20
    assert inspected(supervised, "--step", "10")["step"] == 10
    line = one_line_error(cli("inspect", str(supervised), "--step", "15", cwd=supervised), 2)
    assert "no checkpoint of step 15 (there: 10, 20)" in line


def test_a_file_changed_since_its_commit_is_shown_and_not_exported(
    supervised: Path, tmp_path: Path
):
    run_dir = copied_run(supervised, tmp_path)
    path = run_dir / "checkpoints" / "step_000020.bin"
    with open(path, "r+b") as f:  # a finite weight changed: still a valid file
        f.seek(8)
        f.write(struct.pack("<f", 0.125))
    report = inspected(path)
    assert report["check"]["ok"] is True
    assert report["digest_matches"] is False and report["digest"] != report["recorded_digest"]
    text = cli("inspect", str(path), cwd=run_dir)
    assert "DIFFERS from the commit" in text.stdout

    out = tmp_path / "out"
    line = one_line_error(cli("export", str(path), "--out", str(out), cwd=run_dir), 1)
    assert "digest differs from the one recorded at its commit" in line
    assert not out.exists()


def test_a_corrupt_checkpoint_is_reported_by_inspect_and_refused_by_export(
    supervised: Path, tmp_path: Path
):
    run_dir = copied_run(supervised, tmp_path)
    path = run_dir / "checkpoints" / "step_000010.bin"
    with open(path, "r+b") as f:
        f.seek(8 + 4 * 5)
        f.write(struct.pack("<f", float("nan")))
    report = inspected(path)
    assert report["check"] == {"ok": False, "reason": "step_000010.bin: weight 5 is NaN"}
    line = one_line_error(cli("export", str(path), "--out", str(tmp_path / "o"), cwd=run_dir), 1)
    assert (
        line == "trainwarden: refusing to export step_000010.bin: step_000010.bin: weight 5 is NaN"
    )

    truncated = run_dir / "checkpoints" / "step_000020.bin"
    with open(truncated, "r+b") as f:
        f.truncate(1000)
    report = inspected(truncated)
    assert report["check"]["ok"] is False and "truncated or padded" in report["check"]["reason"]
    assert report["regions"][-1] == {
        "name": "missing",
        "offset": 1000,
        "bytes": 8 + 12 * TINY.n_params - 1000,
    }


def test_a_quarantined_checkpoint_is_named_so_and_not_exported(supervised: Path, tmp_path: Path):
    run_dir = copied_run(supervised, tmp_path)
    quarantine = run_dir / "checkpoints" / "quarantine"
    quarantine.mkdir()
    path = quarantine / "step_000010.bin"
    (run_dir / "checkpoints" / "step_000010.bin").rename(path)
    assert inspected(path)["quarantined"] is True
    line = one_line_error(cli("export", str(path), "--out", str(tmp_path / "o"), cwd=run_dir), 1)
    assert "it is quarantined" in line


def test_a_branch_run_shows_its_record(supervised: Path, tmp_path: Path):
    run_dir = copied_run(supervised, tmp_path)
    info = BranchInfo(supervised, 10, "step_000010.bin", "abc123", {"caps": {"code": 0.2}}, 1.5)
    write_branch(run_dir, info)
    report = inspected(run_dir / "checkpoints" / "step_000020.bin")
    assert report["branch"] == info.to_json()
    text = cli("inspect", str(run_dir / "checkpoints" / "step_000020.bin"), cwd=run_dir)
    assert f"branch      of {supervised} at step 10 (step_000010.bin, digest abc123)" in text.stdout
    # The branch's copy of the parent's checkpoint: the same bytes, the same digest.
    copy = run_dir / "checkpoints" / "step_000010.bin"
    parent_digest = inspected(supervised / "checkpoints" / "step_000010.bin")["digest"]
    for digest, same in ((f"xxh3:{parent_digest}", True), (parent_digest, True), ("abc123", False)):
        write_branch(run_dir, BranchInfo(supervised, 10, "step_000010.bin", digest))
        assert inspected(copy)["branch"]["matches_parent"] is same
    text = cli("inspect", str(copy), cwd=run_dir).stdout
    assert "this file reads NOT the same as the parent's checkpoint did" in text


def test_inspect_and_export_refuse_bad_arguments_in_one_line(supervised: Path, tmp_path: Path):
    missing = tmp_path / "step_000030.bin"
    assert "no such file or folder" in one_line_error(cli("inspect", str(missing), cwd=tmp_path), 2)
    stray = tmp_path / "notes.txt"
    stray.write_text("hello")
    assert "not a checkpoint" in one_line_error(cli("inspect", str(stray), cwd=tmp_path), 2)
    assert "not a checkpoint" in one_line_error(
        cli("export", str(stray), "--out", str(tmp_path / "o"), cwd=tmp_path), 2
    )

    path = supervised / "checkpoints" / "step_000020.bin"
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "model.safetensors").write_bytes(b"old")
    line = one_line_error(cli("export", str(path), "--out", str(taken), cwd=tmp_path), 2)
    assert "already exists and is not an empty folder" in line
    assert (taken / "model.safetensors").read_bytes() == b"old"

    line = one_line_error(
        cli("export", str(path), "--out", str(tmp_path / "o"), "--dtype", "int8", cwd=tmp_path), 2
    )
    assert "invalid choice: 'int8'" in line

    # A folder that cannot be made (a file stands where its parent should be).
    (tmp_path / "blocker").write_text("")
    line = one_line_error(
        cli("export", str(path), "--out", str(tmp_path / "blocker" / "o"), cwd=tmp_path), 2
    )
    assert "cannot create --out" in line and "choose a folder you can write" in line


NO_TORCH = "import sys; sys.modules['torch'] = None"
"""`import torch` then raises ImportError, as where the trainer extra is not installed."""


def test_export_without_torch_says_so_in_one_line(supervised: Path, tmp_path: Path):
    out = tmp_path / "out"
    done = cli("export", str(supervised), "--out", str(out), cwd=tmp_path, prelude=NO_TORCH)
    line = one_line_error(done, 2)
    assert line == (
        "trainwarden: export needs torch, which is not installed: pip install 'trainwarden[trainer]'"
    )
    assert not out.exists()
    # inspect needs no torch at all
    done = cli("inspect", str(supervised), "--json", cwd=tmp_path, prelude=NO_TORCH)
    assert done.returncode == 0 and json.loads(done.stdout)["step"] == 20, done.stderr


def test_export_of_a_run_takes_its_newest_verified_checkpoint(supervised: Path, tmp_path: Path):
    done = cli(
        "export", str(supervised), "--out", str(tmp_path / "out"), "--dtype", "fp16", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"exported step 20 (andrea-bin, {TINY.n_params:,} parameters) as fp16"
    )
    assert "max |logit difference| vs fp32:" in done.stdout
    done = cli(
        "export",
        str(supervised),
        "--step",
        "10",
        "--out",
        str(tmp_path / "ten"),
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["step"] == 10, done.stderr


def test_sharded_hf_weights_and_a_torch_pickle_say_what_is_known(tmp_path: Path):
    folder = tmp_path / "checkpoint-7"
    folder.mkdir()
    shards = {"model-00001-of-00002.safetensors": "a", "model-00002-of-00002.safetensors": "b"}
    for shard, name in shards.items():
        save_file({name: np.zeros((3, 4), dtype=np.float16)}, str(folder / shard))
    index = {"weight_map": {name: shard for shard, name in shards.items()}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 7}))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (folder / name).write_bytes(b"pickle")
    report = inspected(folder)
    assert report["check"]["ok"] is True, report["check"]
    assert report["tensors"] == {
        "files": sorted(shards),
        "count": 2,
        "numel": 24,
        "dtypes": {"F16": 2},
    }
    assert report["step"] == 7 and report["weights_numel"] == 24
    out = tmp_path / "out"
    done = cli("export", str(folder), "--out", str(out), "--dtype", "fp32", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    merged = inspected_safetensors(out / "model.safetensors")
    assert sorted(merged) == ["a", "b"]  # the shards, as one file
    assert {entry["dtype"] for entry in merged.values()} == {"F32"}

    pickle = tmp_path / "ckpt_000300.pt"
    pickle.write_bytes(b"\x80\x04not really")
    report = inspected(pickle)
    assert (report["format"], report["step"], report["bytes"]) == ("torch-pt", 300, 12)
    assert report["unknown"] == [
        "check",
        "n_params",
        "optimizer_numel",
        "optimizer_ratio",
        "recorded_digest",
        "tensors",
        "weights_numel",
    ]
    text = cli("inspect", str(pickle), cwd=tmp_path).stdout
    assert "check       not run for this format" in text and "parameters  unknown" in text


def test_unreadable_or_empty_headers_are_reported_not_raised(tmp_path: Path):
    run_dir = make_run(tmp_path / "run", [PYTHON, "-c", "pass"])  # an andrea-bin run
    folder = run_dir / "checkpoints" / "step_000040.bin"
    folder.mkdir(parents=True)  # a folder under a checkpoint's name
    line = one_line_error(cli("inspect", str(folder), cwd=tmp_path), 2)
    assert line.endswith("step_000040.bin: cannot read: Is a directory"), line
    line = one_line_error(cli("inspect", str(tmp_path / "run2"), cwd=tmp_path), 2)
    assert "no such file or folder" in line

    empty = tmp_path / "step_000005.bin"
    empty.write_bytes(struct.pack("<ii", 5, 0))
    report = inspected(empty)
    assert report["check"] == {
        "ok": False,
        "reason": "step_000005.bin: header says n_params = 0, expected > 0",
    }
    assert (report["step"], report["n_params"], report["weights_numel"]) == (5, 0, None)
    assert "optimizer_ratio" in report["unknown"] and report["regions"] == [
        {"name": "header", "offset": 0, "bytes": 8},
        {"name": "weights", "offset": 8, "bytes": 0},
        {"name": "exp_avg", "offset": 8, "bytes": 0},
        {"name": "exp_avg_sq", "offset": 8, "bytes": 0},
    ]
