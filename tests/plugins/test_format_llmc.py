"""The llmc format on hand-built llm.c checkpoints (model + per-rank state + DONE marker)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.format_trainer import (
    LLMC_N_PARAMS,
    daemon_scenario,
    llmc_model_bytes,
    llmc_state_bytes,
    save_llmc,
)
from trainwarden.plugins.formats.llmc import (
    Llmc,
    done_name,
    gpt2_param_count,
    model_name,
    state_name,
)
from trainwarden.supervisor.errors import CheckpointInvalid
from trainwarden.supervisor.store.checkpoints import CheckpointStore

pytestmark = pytest.mark.timeout(240)


def write_unit(directory: Path, step: int, *, processes: int = 1, zero: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / model_name(step)).write_bytes(llmc_model_bytes(step))
    per_rank = LLMC_N_PARAMS // processes if zero else LLMC_N_PARAMS
    for rank in range(processes):
        header = list(struct.unpack("<256i", llmc_state_bytes(step, rank, processes)[:1024]))
        (directory / state_name(step, rank)).write_bytes(
            struct.pack("<256i", *header) + bytes(12 * per_rank)
        )
    (directory / done_name(step)).write_bytes(b"")
    return directory / done_name(step)


def patch_header(path: Path, index: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    data[4 * index : 4 * index + 4] = struct.pack("<i", value)
    path.write_bytes(bytes(data))


def invalid(path: Path) -> str:
    with pytest.raises(CheckpointInvalid) as caught:
        Llmc({}).verify(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_parameter_count_matches_llmc_for_gpt2_124m():
    # llm.c prints "num_parameters: 124475904" for GPT-2 124M (Vp 50304, maxT 1024, L 12, C 768).
    assert gpt2_param_count(1024, 50304, 12, 768) == 124_475_904
    assert gpt2_param_count(8, 16, 1, 4) == LLMC_N_PARAMS


def test_the_done_marker_is_the_unit_and_unmarked_files_are_in_flight(tmp_path: Path):
    fmt = Llmc({})
    (tmp_path / model_name(100)).write_bytes(b"")
    (tmp_path / state_name(100, 0)).write_bytes(b"")
    assert fmt.step_of(tmp_path / done_name(100)) == 100
    assert fmt.step_of(tmp_path / model_name(100)) is None
    assert fmt.is_in_flight(tmp_path / model_name(100))
    assert fmt.is_in_flight(tmp_path / state_name(100, 0))
    (tmp_path / done_name(100)).write_bytes(b"")
    assert not fmt.is_in_flight(tmp_path / model_name(100))
    assert not fmt.is_in_flight(tmp_path / done_name(100))
    assert not fmt.is_in_flight(tmp_path / "main.log")
    (tmp_path / state_name(100, 1)).write_bytes(b"")
    assert fmt.companions(tmp_path / done_name(100)) == [
        tmp_path / model_name(100),
        tmp_path / state_name(100, 0),
        tmp_path / state_name(100, 1),
    ]


def test_a_complete_checkpoint_verifies(tmp_path: Path):
    save_llmc(tmp_path, 100)
    info = Llmc({}).verify(tmp_path / done_name(100))
    assert info.step == 100 and info.n_params == LLMC_N_PARAMS
    assert info.path == tmp_path / done_name(100)
    assert info.bytes == (1024 + 4 * LLMC_N_PARAMS) + (1024 + 12 * LLMC_N_PARAMS)


def test_bf16_model_and_zero1_sharded_states_verify(tmp_path: Path):
    done = write_unit(tmp_path, 200, processes=2, zero=True)
    (tmp_path / model_name(200)).write_bytes(llmc_model_bytes(200, version=5))
    assert Llmc({}).verify(done).n_params == LLMC_N_PARAMS
    done = write_unit(tmp_path, 300, processes=2)
    assert Llmc({}).verify(done).step == 300


def test_shuffled_loader_state_is_sized_exactly(tmp_path: Path):
    done = write_unit(tmp_path, 100)
    state = tmp_path / state_name(100, 0)
    patch_header(state, 5, 1)
    shards, samples = [1, 0, 2], list(range(7))
    tail = (
        struct.pack("<Q", len(shards)) + struct.pack(f"<{len(shards)}i", *shards)
        + struct.pack("<Q", len(samples)) + struct.pack(f"<{len(samples)}i", *samples)
        + bytes(2520)
    )  # fmt: skip
    base = state.read_bytes()
    state.write_bytes(base + tail)
    assert Llmc({}).verify(done).step == 100
    state.write_bytes(base + tail[:-1])
    assert "+ shuffle state (truncated or padded)" in invalid(done)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: patch_header(d / model_name(100), 0, 123), "magic 123, expected 20240326"),
        (lambda d: patch_header(d / model_name(100), 1, 4), "version 4, expected 3 (fp32) or 5"),
        (lambda d: patch_header(d / model_name(100), 6, 0), "implausible config"),
        (lambda d: (d / model_name(100)).write_bytes(llmc_model_bytes(100)[:-4]), "truncated"),
        (lambda d: (d / model_name(100)).write_bytes(llmc_model_bytes(100)[:100]), "shorter than"),
        (lambda d: (d / model_name(100)).unlink(), "model_00000100.bin is missing"),
        (lambda d: patch_header(d / state_name(100, 0), 0, 7), "magic 7, expected 20240527"),
        (lambda d: patch_header(d / state_name(100, 0), 1, 2), "version 2, expected 1"),
        (lambda d: patch_header(d / state_name(100, 0), 10, 90), "header step 90 does not match"),
        (lambda d: patch_header(d / state_name(100, 0), 3, 1), "rank 1 of 1, expected rank 0"),
        (lambda d: patch_header(d / state_name(100, 0), 4, 0), "truncated or padded"),
        (lambda d: (d / state_name(100, 0)).unlink(), "state_00000100_00000.bin: missing"),
        (lambda d: (d / state_name(100, 3)).write_bytes(b""), "belongs to no rank"),
    ],
    ids=[
        "model-magic", "model-version", "model-config", "model-truncated", "model-short",
        "model-missing", "state-magic", "state-version", "state-step", "state-rank",
        "state-size", "state-missing", "stray-rank",
    ],
)  # fmt: skip
def test_damaged_checkpoints_are_invalid(tmp_path: Path, damage, expected: str):
    save_llmc(tmp_path, 100)
    damage(tmp_path)
    assert expected in invalid(tmp_path / done_name(100))


def test_a_missing_rank_is_invalid(tmp_path: Path):
    done = write_unit(tmp_path, 100, processes=2)
    (tmp_path / state_name(100, 1)).unlink()
    assert "state_00000100_00001.bin: missing" in invalid(done)


def test_store_moves_and_deletes_the_whole_unit(tmp_path: Path):
    directory = tmp_path / "checkpoints"
    store = CheckpointStore(directory, Llmc({}))
    write_unit(directory, 10, processes=2)
    write_unit(directory, 20)
    (directory / model_name(30)).write_bytes(b"half written")
    (directory / "main.log").write_text("s:0 trl:4.2\n")
    assert store.scan() == ([done_name(10), done_name(20)], [model_name(30)])
    assert sorted(store.quarantine(done_name(10))) == sorted(
        [done_name(10), model_name(10), state_name(10, 0), state_name(10, 1)]
    )
    assert store.delete(done_name(20)) == [done_name(20), model_name(20), state_name(20, 0)]
    assert store.remove_stale_in_flight() == [model_name(30)]
    assert sorted(p.name for p in directory.iterdir()) == ["main.log", "quarantine"]


def test_daemon_retains_and_falls_back_with_llmc(tmp_path: Path):
    def corrupt(directory: Path, step: int) -> None:
        model = directory / model_name(step)
        model.write_bytes(model.read_bytes()[:-8])

    def unit_step(name: str) -> int | None:
        if name.startswith(("DONE_", "model_", "state_")):
            return int(name.split("_")[1].split(".")[0])
        return None

    daemon_scenario(tmp_path, Llmc({}), unit_step, corrupt, "truncated or padded")
