"""The `llmc` checkpoint format: llm.c's `model_%08d.bin` + `state_%08d_%05d.bin` + `DONE_%08d`.

llm.c's write_checkpoint writes the model file (rank 0) and one state file per rank in
place, waits for every rank, then creates the empty `DONE_%08d` marker: the marker is
the commit point. So the marker is the checkpoint's name here (its main path, what
TRAINWARDEN_RESUME names and retention keys on); the model and state files of that step
are its companions, deleted and quarantined with it. Model or state files whose marker
does not exist yet are a write in flight (and are removed at daemon start after a crash,
like a stale .tmp). The marker arrives by fopen/fclose, which the watcher reports as a
closed file.

Verification reads only headers and sizes:
- model: int32 header[256], magic 20240326, version 3 (fp32) or 5 (bf16); the file holds
  exactly 1024 bytes + N parameters of 4 (or 2) bytes, N computed from the header's
  maxT, V, Vp, L, C as llm.c's fill_in_parameter_sizes does;
- state (every rank 0..num_processes-1): magic 20240527, version 1, the rank and step
  it claims, then AdamW m and v (and fp32 master weights when header[4] says so) for all
  N parameters (or N / num_processes with ZeRO-1), then the data loader's shuffle state
  when header[5] says so.

llm.c's own `-nk` (keep only the last N checkpoints) should stay 0: let the daemon retain.
llm.c resumes itself from the newest DONE marker in its output folder with `-y 1`, which
is the one the daemon picked (the ones it rejected are in quarantine/).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainwarden.plugins.api import CheckpointInfo, CheckpointInvalid

MODEL_MAGIC = 20240326
STATE_MAGIC = 20240527
HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS
BYTES_PER_PARAM = {3: 4, 5: 2}
MT19937_STATE_BYTES = 2520  # u64 seed, int left, u32 next, u32 state[624], u32 MATRIX_A[2]

DONE = re.compile(r"^DONE_(\d{8,})$")
MODEL = re.compile(r"^model_(\d{8,})\.bin$")
STATE = re.compile(r"^state_(\d{8,})_(\d{5,})\.bin$")


def done_name(step: int) -> str:
    return f"DONE_{step:08d}"


def model_name(step: int) -> str:
    return f"model_{step:08d}.bin"


def state_name(step: int, rank: int) -> str:
    return f"state_{step:08d}_{rank:05d}.bin"


def gpt2_param_count(
    max_seq_len: int, padded_vocab_size: int, num_layers: int, channels: int
) -> int:
    """Parameters of llm.c's GPT-2: wte, wpe, L x (ln1, qkv, attproj, ln2, fc, fcproj), lnf."""
    C, L = channels, num_layers
    per_layer = 12 * C * C + 13 * C
    return padded_vocab_size * C + max_seq_len * C + L * per_layer + 2 * C


def _read_header(path: Path, label: str) -> tuple[list[int], int]:
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
            size = f.seek(0, 2)
    except FileNotFoundError:
        raise CheckpointInvalid(f"{label}: missing") from None
    except OSError as exc:
        raise CheckpointInvalid(f"{label}: cannot read: {exc.strerror}") from None
    if len(raw) < HEADER_BYTES:
        raise CheckpointInvalid(f"{label}: {len(raw)} bytes, shorter than the 1024-byte header")
    return list(struct.unpack(f"<{HEADER_INTS}i", raw)), size


def verify_model(path: Path) -> int:
    """The parameter count of a model file whose header and size agree; raises CheckpointInvalid."""
    header, size = _read_header(path, path.name)
    if header[0] != MODEL_MAGIC:
        raise CheckpointInvalid(f"{path.name}: magic {header[0]}, expected {MODEL_MAGIC}")
    version = header[1]
    if version not in BYTES_PER_PARAM:
        raise CheckpointInvalid(f"{path.name}: version {version}, expected 3 (fp32) or 5 (bf16)")
    max_t, vocab, layers, heads, channels, padded_vocab = header[2:8]
    if min(max_t, vocab, layers, heads, channels) <= 0 or padded_vocab < vocab:
        raise CheckpointInvalid(
            f"{path.name}: implausible config maxT={max_t} V={vocab} Vp={padded_vocab} "
            f"L={layers} NH={heads} C={channels}"
        )
    n_params = gpt2_param_count(max_t, padded_vocab, layers, channels)
    expected = HEADER_BYTES + n_params * BYTES_PER_PARAM[version]
    if size != expected:
        raise CheckpointInvalid(
            f"{path.name}: {size} bytes, expected 1024 + {n_params} x {BYTES_PER_PARAM[version]} = "
            f"{expected} (truncated or padded)"
        )
    return n_params


def _state_tail_bytes(path: Path, offset: int, size: int) -> int | None:
    """Bytes of the shuffled data loader's state starting at offset, or None if unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read(8)
            if len(raw) < 8:
                return None
            (n_shards,) = struct.unpack("<Q", raw)
            f.seek(offset + 8 + 4 * n_shards)
            raw = f.read(8)
            if len(raw) < 8:
                return None
            (n_samples,) = struct.unpack("<Q", raw)
    except (OSError, OverflowError, ValueError):
        return None
    return 8 + 4 * n_shards + 8 + 4 * n_samples + MT19937_STATE_BYTES


def verify_state(path: Path, step: int, rank: int, n_params: int) -> tuple[int, int]:
    """(num_processes, bytes) of a state file consistent with its header; raises CheckpointInvalid."""
    header, size = _read_header(path, path.name)
    if header[0] != STATE_MAGIC:
        raise CheckpointInvalid(f"{path.name}: magic {header[0]}, expected {STATE_MAGIC}")
    if header[1] != 1:
        raise CheckpointInvalid(f"{path.name}: version {header[1]}, expected 1")
    processes, file_rank, master_weights, shuffle = header[2:6]
    if processes < 1 or file_rank != rank:
        raise CheckpointInvalid(
            f"{path.name}: header says rank {file_rank} of {processes}, expected rank {rank}"
        )
    if header[10] != step:
        raise CheckpointInvalid(f"{path.name}: header step {header[10]} does not match step {step}")
    buffers = 2 + (1 if master_weights else 0)
    shard_sizes = [n_params] + (
        [n_params // processes] if processes > 1 and n_params % processes == 0 else []
    )
    extended = header[6] != 0 or header[7] != 0  # newer builds append more state
    for shard in shard_sizes:
        base = HEADER_BYTES + 4 * buffers * shard
        if not shuffle:
            tail: int | None = 0
        else:
            tail = _state_tail_bytes(path, base, size)
        if tail is not None and (size == base + tail or (extended and size >= base + tail)):
            return processes, size
    raise CheckpointInvalid(
        f"{path.name}: {size} bytes, inconsistent with {n_params} parameters x {buffers} float32 "
        f"buffers{' + shuffle state' if shuffle else ''} (truncated or padded)"
    )


class Llmc:
    """llm.c's model + per-rank state files, committed by the DONE marker."""

    name = "llmc"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    def step_of(self, path: Path) -> int | None:
        match = DONE.match(path.name)
        return int(match.group(1)) if match else None

    def is_in_flight(self, path: Path) -> bool:
        match = MODEL.match(path.name) or STATE.match(path.name)
        if match is None:
            return False
        return not (path.parent / done_name(int(match.group(1)))).exists()

    def companions(self, path: Path) -> list[Path]:
        step = self.step_of(path)
        if step is None:
            return []
        states = sorted(path.parent.glob(f"state_{step:08d}_*.bin"))
        return [path.parent / model_name(step), *(p for p in states if STATE.match(p.name))]

    def verify(self, path: Path) -> CheckpointInfo:
        step = self.step_of(path)
        if step is None:
            raise CheckpointInvalid(f"{path.name}: not an llmc checkpoint marker (DONE_%08d)")
        if not path.is_file():
            raise CheckpointInvalid(f"{path.name}: the DONE marker is not a regular file")
        directory = path.parent
        model = directory / model_name(step)
        if not model.exists():
            raise CheckpointInvalid(f"{path.name}: {model.name} is missing")
        n_params = verify_model(model)
        total = model.stat().st_size
        processes, size = verify_state(directory / state_name(step, 0), step, 0, n_params)
        total += size
        for rank in range(1, processes):
            _, size = verify_state(directory / state_name(step, rank), step, rank, n_params)
            total += size
        extra = [
            p.name
            for p in directory.glob(f"state_{step:08d}_*.bin")
            if (m := STATE.match(p.name)) and int(m.group(2)) >= processes
        ]
        if extra:
            raise CheckpointInvalid(
                f"{path.name}: {sorted(extra)[0]} belongs to no rank of the {processes} process(es) "
                "the state header names"
            )
        return CheckpointInfo(step=step, path=path, bytes=total, n_params=n_params)
