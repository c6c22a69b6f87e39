"""The hf-trainer format on folders whose weights the safetensors library wrote."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from tests.format_trainer import daemon_scenario, save_hf_trainer
from trainwarden.plugins.formats.hf_trainer import HfTrainer, read_safetensors_header
from trainwarden.supervisor.errors import CheckpointInvalid, ConfigError
from trainwarden.supervisor.store.checkpoints import CheckpointStore

pytestmark = pytest.mark.timeout(240)


def checkpoint(directory: Path, step: int = 100) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_hf_trainer(directory, step)
    return directory / f"checkpoint-{step}"


def invalid(path: Path, fmt: HfTrainer | None = None) -> str:
    with pytest.raises(CheckpointInvalid) as caught:
        (fmt or HfTrainer({})).verify(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(path.name)
    return message


def raw_safetensors(path: Path, header: dict[str, object], data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_a_folder_is_committed_once_trainer_state_exists(tmp_path: Path):
    fmt = HfTrainer({})
    folder = tmp_path / "checkpoint-100"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"partial")
    assert fmt.step_of(folder) is None and fmt.is_in_flight(folder)
    (folder / "trainer_state.json").write_text('{"global_step": 100}')
    assert fmt.step_of(folder) == 100 and not fmt.is_in_flight(folder)
    assert fmt.is_in_flight(tmp_path / "tmp-checkpoint-ab12cd")
    assert fmt.step_of(tmp_path / "runs") is None and not fmt.is_in_flight(tmp_path / "runs")
    not_a_dir = tmp_path / "checkpoint-7"
    not_a_dir.write_text("")
    assert fmt.step_of(not_a_dir) is None and not fmt.is_in_flight(not_a_dir)
    assert fmt.companions(folder) == []
    assert fmt.commits_folder(folder / "trainer_state.json")
    assert not fmt.commits_folder(folder / "rng_state.pth")
    assert not fmt.commits_folder(tmp_path / "runs" / "trainer_state.json")


def test_a_trainer_checkpoint_verifies(tmp_path: Path):
    folder = checkpoint(tmp_path)
    info = HfTrainer({}).verify(folder)
    total = sum(p.stat().st_size for p in folder.iterdir())
    assert (info.step, info.path, info.bytes, info.n_params) == (100, folder, total, 20)


def test_safetensors_written_by_the_library_parse_and_agree(tmp_path: Path):
    tensors = {
        "a": torch.zeros(3, 5, dtype=torch.bfloat16),
        "b": torch.ones(7, dtype=torch.float32),
        "c": torch.zeros(0, 4, dtype=torch.int64),
        "d": torch.zeros(2, 2, dtype=torch.bool),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    header, n_params = read_safetensors_header(path)
    assert n_params == 15 + 7 + 0 + 4
    assert header["__metadata__"] == {"format": "pt"}
    assert header["a"]["dtype"] == "BF16" and header["a"]["shape"] == [3, 5]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shapes=st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=5),
    cut=st.integers(1, 64),
)
def test_any_library_file_parses_and_any_truncation_is_caught(tmp_path: Path, shapes, cut):
    tensors = {
        f"t{i}": torch.zeros(tuple(shape), dtype=torch.float16) for i, shape in enumerate(shapes)
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    _, n_params = read_safetensors_header(path)
    assert n_params == sum(t.numel() for t in tensors.values())
    data = path.read_bytes()
    path.write_bytes(data[: max(0, len(data) - cut)])
    with pytest.raises(CheckpointInvalid):
        read_safetensors_header(path)
    path.write_bytes(data + b"\0" * cut)
    with pytest.raises(CheckpointInvalid, match="truncated or padded"):
        read_safetensors_header(path)


@pytest.mark.parametrize(
    ("header", "data", "expected"),
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12), "overlaps"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12), "gap"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), "needs 12"),
        ({"a": {"dtype": "F32", "shape": [2]}}, bytes(8), "lacks dtype, shape or data_offsets"),
        ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8), "malformed"),
    ],
    ids=["overlap", "gap", "dtype-size", "no-offsets", "negative-shape"],
)  # fmt: skip
def test_inconsistent_headers_are_invalid(tmp_path: Path, header, data, expected):
    path = tmp_path / "model.safetensors"
    raw_safetensors(path, header, data)
    with pytest.raises(CheckpointInvalid, match=expected):
        read_safetensors_header(path)


def test_header_length_and_json_problems(tmp_path: Path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(CheckpointInvalid, match="runs past the end"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 4) + b"[1] ")
    with pytest.raises(CheckpointInvalid, match="does not start with"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 4) + b"{1: ")
    with pytest.raises(CheckpointInvalid, match="not valid JSON"):
        read_safetensors_header(path)
    path.write_bytes(b"\1\2")
    with pytest.raises(CheckpointInvalid, match="shorter than the 8-byte"):
        read_safetensors_header(path)


def test_global_step_must_match_the_folder_name(tmp_path: Path):
    folder = checkpoint(tmp_path)
    (folder / "trainer_state.json").write_text('{"global_step": 90}')
    assert "global_step is 90, expected 100" in invalid(folder)
    (folder / "trainer_state.json").write_text("{not json")
    assert "trainer_state.json: not valid JSON" in invalid(folder)


def test_truncated_weights_and_missing_files_are_invalid(tmp_path: Path):
    folder = checkpoint(tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-4])
    assert "truncated or padded" in invalid(folder)
    weights.write_bytes(data)
    (folder / "optimizer.pt").unlink()
    assert "no non-empty optimizer.pt" in invalid(folder)
    assert HfTrainer({"required_files": []}).verify(folder).step == 100
    (folder / "rng_state.pth").rename(folder / "rng_state_0.pth")
    (folder / "rng_state_1.pth").write_bytes(b"x")
    assert (
        HfTrainer({"required_files": ["scheduler.pt", "rng_state*.pth"]}).verify(folder).step == 100
    )
    weights.unlink()
    assert "no model.safetensors" in invalid(folder)


def test_sharded_weights_are_checked_shard_by_shard(tmp_path: Path):
    folder = checkpoint(tmp_path)
    (folder / "model.safetensors").unlink()
    save_file({"a": torch.zeros(6)}, str(folder / "model-00001-of-00002.safetensors"))
    save_file(
        {"b": torch.zeros(4), "c": torch.zeros(1)}, str(folder / "model-00002-of-00002.safetensors")
    )
    index: dict[str, Any] = {
        "metadata": {"total_size": 44},
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
            "c": "model-00002-of-00002.safetensors",
        },
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert HfTrainer({}).verify(folder).n_params == 11
    index["weight_map"]["d"] = "model-00001-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "lacks 1 tensor(s) the index places there, e.g. 'd'" in invalid(folder)
    del index["weight_map"]["d"]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model-00002-of-00002.safetensors").unlink()
    assert "shard listed in the index is missing" in invalid(folder)
    index["weight_map"]["b"] = "../escape.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "bad shard name" in invalid(folder)


def test_bad_required_files_option_is_a_config_error():
    with pytest.raises(ConfigError, match=r"'checkpoints\.options\.required_files'"):
        HfTrainer({"options": {"required_files": "optimizer.pt"}})


def test_store_deletes_and_quarantines_whole_folders(tmp_path: Path):
    directory = tmp_path / "checkpoints"
    store = CheckpointStore(directory, HfTrainer({}))
    for step in (10, 20, 30):
        checkpoint(directory, step)
    (directory / "checkpoint-40").mkdir()  # a write in flight
    assert store.scan() == (["checkpoint-10", "checkpoint-20", "checkpoint-30"], ["checkpoint-40"])
    assert store.delete("checkpoint-10") == ["checkpoint-10"]
    assert not (directory / "checkpoint-10").exists()
    assert store.quarantine("checkpoint-20") == ["checkpoint-20"]
    assert (directory / "quarantine" / "checkpoint-20" / "model.safetensors").is_file()
    assert store.remove_stale_in_flight() == ["checkpoint-40"]
    assert sorted(p.name for p in directory.iterdir()) == ["checkpoint-30", "quarantine"]
    assert store.verify("checkpoint-30").info is not None


def test_daemon_retains_and_falls_back_with_hf_trainer(tmp_path: Path):
    def corrupt(directory: Path, step: int) -> None:
        weights = directory / f"checkpoint-{step}" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-10])

    def unit_step(name: str) -> int | None:
        return int(name.split("-")[1]) if name.startswith("checkpoint-") else None

    daemon_scenario(tmp_path, HfTrainer({}), unit_step, corrupt, "truncated or padded")


def test_a_step_beyond_2_31_is_refused_at_the_store_with_one_line(tmp_path: Path):
    directory = tmp_path / "checkpoints"
    checkpoint(directory, step=2**31)
    checkpoint(directory, step=2**31 - 1)
    store = CheckpointStore(directory, HfTrainer({}))
    refused = store.verify(f"checkpoint-{2**31}")
    assert refused.outcome == "invalid" and refused.info is None
    assert refused.reason == f"checkpoint-{2**31}: step {2**31} is beyond 2147483647 (2^31-1)"
    assert store.verify(f"checkpoint-{2**31 - 1}").outcome == "verified"
