"""The `hf-trainer` checkpoint format: the Hugging Face Trainer's `checkpoint-N/` folders.

The folder is the unit: retention deletes it whole and quarantine moves it whole, so
there are no companions. The Trainer writes a checkpoint in place, in this order: the
weights (model.safetensors, or shards listed in model.safetensors.index.json), then
optimizer.pt, scheduler.pt and rng_state.pth (rng_state_<rank>.pth with several
processes), then trainer_state.json last. So a folder counts as committed once its
trainer_state.json exists and says `global_step` = N; until then it is a write in flight
(as is a `tmp-checkpoint-*` staging folder some Trainer versions rename into place).
An incomplete folder left by a crash is removed at daemon start, like a stale .tmp file.

Verification reads no tensor data: it parses the safetensors header of every weights
file (8-byte little-endian length, then a JSON header whose data offsets must tile the
rest of the file exactly, each tensor's byte length matching its dtype and shape) and
checks that the optimizer, scheduler and RNG files are present and not empty.

The Trainer's own `save_total_limit`: leave it unset. With it set, the Trainer deletes old
checkpoint folders behind the daemon's back, possibly one the daemon would restart from,
and it does not know which checkpoints are verified or pinned. Let the daemon retain
(`[checkpoints] keep_last`); it deletes only after a newer checkpoint is committed and
verified. Resume with `trainer.train(resume_from_checkpoint=os.environ.get("TRAINWARDEN_RESUME"))`:
the variable names the checkpoint folder.

Options (`[checkpoints] options = {...}`): required_files (glob patterns that must match
a non-empty file; default optimizer.pt, scheduler.pt, rng_state*.pth; set [] for
`save_only_model=True`).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainwarden.plugins.api import CheckpointInfo, CheckpointInvalid, ConfigError

NAME = re.compile(r"^checkpoint-(\d+)$")
STAGING = re.compile(r"^tmp-checkpoint-[^/]+$")
TRAINER_STATE = "trainer_state.json"
SINGLE_WEIGHTS = ("model.safetensors", "adapter_model.safetensors")
WEIGHTS_INDEX = "model.safetensors.index.json"
DEFAULT_REQUIRED = ("optimizer.pt", "scheduler.pt", "rng_state*.pth")
MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_JSON_BYTES = 64 * 1024 * 1024

# Bits per element; sub-byte types pack, so a tensor's bytes are numel * bits / 8.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """(the tensor entries of a safetensors file, its parameter count), checked against its size.

    Raises CheckpointInvalid naming the file and the first problem found.
    """
    label = f"{path.parent.name}/{path.name}"
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointInvalid(
                    f"{label}: {len(head)} bytes, shorter than the 8-byte header length"
                )
            (header_len,) = struct.unpack("<Q", head)
            if header_len > MAX_HEADER_BYTES:
                raise CheckpointInvalid(f"{label}: header length {header_len} exceeds 100 MiB")
            if 8 + header_len > size:
                raise CheckpointInvalid(
                    f"{label}: header length {header_len} runs past the end of the {size}-byte file"
                )
            raw = f.read(header_len)
    except OSError as exc:
        raise CheckpointInvalid(f"{label}: cannot read: {exc.strerror}") from None
    if not raw.startswith(b"{"):
        raise CheckpointInvalid(f"{label}: header does not start with '{{'")
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise CheckpointInvalid(f"{label}: header is not valid JSON") from None
    if not isinstance(header, dict):
        raise CheckpointInvalid(f"{label}: header is not a JSON object")
    data_bytes = size - 8 - header_len
    spans: list[tuple[int, int, str]] = []
    n_params = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise CheckpointInvalid(
                f"{label}: tensor {name!r} lacks dtype, shape or data_offsets"
            ) from None
        if not (
            isinstance(shape, list)
            and all(isinstance(d, int) and d >= 0 for d in shape)
            and isinstance(begin, int)
            and isinstance(end, int)
            and 0 <= begin <= end
        ):
            raise CheckpointInvalid(
                f"{label}: tensor {name!r} has a malformed shape or data_offsets"
            )
        numel = math.prod(shape)
        bits = DTYPE_BITS.get(dtype)
        if bits is not None and (end - begin) * 8 != numel * bits:
            raise CheckpointInvalid(
                f"{label}: tensor {name!r} spans {end - begin} bytes, but {dtype} {shape} needs "
                f"{numel * bits / 8:g}"
            )
        n_params += numel
        spans.append((begin, end, name))
    spans.sort()
    position = 0
    for begin, end, name in spans:
        if begin != position:
            problem = "overlaps the previous one" if begin < position else "leaves a gap before it"
            raise CheckpointInvalid(f"{label}: tensor {name!r} at offset {begin} {problem}")
        position = end
    if position != data_bytes:
        raise CheckpointInvalid(
            f"{label}: tensors cover {position} data bytes, but the file holds {data_bytes} "
            "(truncated or padded)"
        )
    return header, n_params


def _read_json(path: Path, label: str) -> Any:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise CheckpointInvalid(f"{label}: larger than 64 MiB")
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CheckpointInvalid(f"{label}: missing") from None
    except OSError as exc:
        raise CheckpointInvalid(f"{label}: cannot read: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError):
        raise CheckpointInvalid(f"{label}: not valid JSON") from None


class HfTrainer:
    """`checkpoint-N/` folders of the Hugging Face Trainer, committed by trainer_state.json."""

    name = "hf-trainer"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        options.update(options.pop("options", None) or {})
        required = options.get("required_files", list(DEFAULT_REQUIRED))
        if not isinstance(required, list | tuple) or not all(
            isinstance(p, str) and p for p in required
        ):
            raise ConfigError(
                f"'checkpoints.options.required_files' = {required!r} is invalid for hf-trainer: "
                'expected a list of file name patterns, for example ["optimizer.pt", "rng_state*.pth"]'
            )
        self.required_files: list[str] = list(required)

    def step_of(self, path: Path) -> int | None:
        match = NAME.match(path.name)
        if match is None or not (path / TRAINER_STATE).is_file():
            return None
        return int(match.group(1))

    def is_in_flight(self, path: Path) -> bool:
        if STAGING.match(path.name):
            return True
        return (
            NAME.match(path.name) is not None
            and path.is_dir()
            and not (path / TRAINER_STATE).exists()
        )

    def companions(self, path: Path) -> list[Path]:
        return []

    def name_for(self, step: int) -> str:
        """The committed name of a checkpoint of `step` (a fixed folder's snapshots)."""
        return f"checkpoint-{step}"

    def commits_folder(self, path: Path) -> bool:
        """True when closing or renaming `path`, a file inside a checkpoint folder, commits
        the folder: only trainer_state.json does, the Trainer's last write. The watcher must
        not judge a folder on any other file's event: trainer_state.json may exist by then
        but still be half written."""
        return path.name == TRAINER_STATE and NAME.match(path.parent.name) is not None

    def verify(self, path: Path) -> CheckpointInfo:
        match = NAME.match(path.name)
        if match is None:
            raise CheckpointInvalid(
                f"{path.name}: not an hf-trainer checkpoint name (checkpoint-N)"
            )
        name_step = int(match.group(1))
        if not path.is_dir():
            raise CheckpointInvalid(f"{path.name}: not a directory")
        state = _read_json(path / TRAINER_STATE, f"{path.name}/{TRAINER_STATE}")
        global_step = state.get("global_step") if isinstance(state, dict) else None
        if global_step != name_step:
            raise CheckpointInvalid(
                f"{path.name}/{TRAINER_STATE}: global_step is {global_step!r}, expected {name_step}"
            )
        n_params = self._verify_weights(path)
        for pattern in self.required_files:
            found = [p for p in path.glob(pattern) if p.is_file() and p.stat().st_size > 0]
            if not found:
                raise CheckpointInvalid(f"{path.name}: no non-empty {pattern} (saved without it?)")
        total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return CheckpointInfo(step=name_step, path=path, bytes=total, n_params=n_params or None)

    def _verify_weights(self, path: Path) -> int:
        index_path = path / WEIGHTS_INDEX
        if index_path.exists():
            index = _read_json(index_path, f"{path.name}/{WEIGHTS_INDEX}")
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointInvalid(f"{path.name}/{WEIGHTS_INDEX}: no weight_map")
            shards: dict[str, list[str]] = {}
            for tensor, shard in weight_map.items():
                if not isinstance(shard, str) or "/" in shard or shard in ("", ".", ".."):
                    raise CheckpointInvalid(
                        f"{path.name}/{WEIGHTS_INDEX}: bad shard name {shard!r}"
                    )
                shards.setdefault(shard, []).append(tensor)
            n_params = 0
            for shard, tensors in sorted(shards.items()):
                shard_path = path / shard
                if not shard_path.is_file():
                    raise CheckpointInvalid(
                        f"{path.name}/{shard}: shard listed in the index is missing"
                    )
                header, count = read_safetensors_header(shard_path)
                absent = [t for t in tensors if t not in header]
                if absent:
                    raise CheckpointInvalid(
                        f"{path.name}/{shard}: lacks {len(absent)} tensor(s) the index places there, "
                        f"e.g. {absent[0]!r}"
                    )
                n_params += count
            return n_params
        for name in SINGLE_WEIGHTS:
            if (path / name).exists():
                return read_safetensors_header(path / name)[1]
        raise CheckpointInvalid(
            f"{path.name}: no model.safetensors, {WEIGHTS_INDEX} or adapter_model.safetensors"
        )
