"""`python -m trainwarden.trainer.export`: a checkpoint's inference weights as safetensors.

Run by `trainwarden export` as a child process (the command line never imports torch or
the trainer). Writes OUT/model.safetensors (weights only: no Adam moments, no optimizer
file) and OUT/config.json (the model's shape), then prints one JSON report on stdout:
the resume file's bytes against the export's, and for the reference trainer's model the
largest logit difference the exported dtype causes on a fixed held-out probe batch.

The logits are computed in float32 both times, from the checkpoint's weights and from
the weights read back from the file just written: the difference is what storing the
weights in the exported dtype costs, exactly 0 for fp32, whatever the probe's platform
does with half-precision arithmetic. Exit status 2 with one line on stderr when the
checkpoint cannot be exported.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import struct
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from trainwarden.plugins.api import CheckpointInvalid
from trainwarden.plugins.formats.andrea_bin import AndreaBin
from trainwarden.supervisor.contract import sidecar_path
from trainwarden.trainer.atomic import fsync_dir, write_json_atomically
from trainwarden.trainer.batches import as_tokens, validation_batch
from trainwarden.trainer.checkpoint import read_regions
from trainwarden.trainer.corpus import ARM_NAMES, build_arms
from trainwarden.trainer.errors import TrainerError
from trainwarden.trainer.model import GPT
from trainwarden.trainer.presets import PRESETS, Preset

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TORCH_DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""The safetensors dtypes `read_safetensors` reads, by their header names."""
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
PROBE_ROWS = 4
"""Held-out sequences per data arm in the probe batch."""
PROBE_SEED = 0
MAX_HEADER_BYTES = 100 * 1024 * 1024


class ExportRefused(TrainerError):
    """The checkpoint cannot be exported as asked."""


# ----------------------------------------------------------------------------- safetensors


def write_safetensors(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    """`tensors` and `metadata` as a safetensors file, serialized by the safetensors package
    and written to a .tmp name, fsynced and renamed."""
    flat = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    # save, not save_file: save_file reports a failed write as a SafetensorError whose
    # errno is only in its message, and a full volume must stay an OSError to be named.
    encoded = safetensors.torch.save(flat, metadata)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(encoded)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, in its stored dtype."""
    data = path.read_bytes()
    if len(data) < 8:
        raise ExportRefused(f"{path}: shorter than a safetensors header")
    (length,) = struct.unpack("<Q", data[:8])
    if length > MAX_HEADER_BYTES or 8 + length > len(data):
        raise ExportRefused(f"{path}: its safetensors header length {length} is impossible")
    header = json.loads(data[8 : 8 + length])
    base = 8 + length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = TORCH_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ExportRefused(
                f"{path}: tensor {name!r} has dtype {entry['dtype']}, not supported"
            )
        begin, end = entry["data_offsets"]
        chunk = bytearray(data[base + begin : base + end])
        tensor = torch.frombuffer(chunk, dtype=dtype) if chunk else torch.empty(0, dtype=dtype)
        tensors[name] = tensor.reshape(entry["shape"])
    return tensors


def cast(tensors: dict[str, torch.Tensor], dtype_name: str) -> dict[str, torch.Tensor]:
    """Floating tensors in the export dtype (others as they are); refused when a finite
    value does not fit it (beyond fp16's 65,504), rather than written as inf."""
    dtype = DTYPES[dtype_name]
    out = {}
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            out[name] = tensor
            continue
        converted = tensor.detach().to(dtype)
        if not bool(torch.isfinite(converted).all()) and bool(torch.isfinite(tensor).all()):
            raise ExportRefused(
                f"{name} holds values beyond the range of {dtype_name}; export as bf16 or fp32"
            )
        out[name] = converted
    return out


# ----------------------------------------------------------------------------- the reference model


def preset_of(path: Path, n_params: int) -> Preset:
    """The checkpoint's preset: its sidecar's, else the one preset of its parameter count."""
    try:
        named = json.loads(sidecar_path(path).read_bytes()).get("preset")
    except (OSError, ValueError, AttributeError):
        named = None
    if isinstance(named, str) and named in PRESETS:
        preset = PRESETS[named]
    else:
        fitting = [p for p in PRESETS.values() if p.n_params == n_params]
        if len(fitting) != 1:
            raise ExportRefused(
                f"{path.name}: no sidecar names its preset and {n_params:,} parameters fit"
                f" {len(fitting)} presets; put its step_NNNNNN.json beside it"
            )
        preset = fitting[0]
    if preset.n_params != n_params:
        raise ExportRefused(
            f"{path.name}: {n_params:,} parameters, but preset {preset.name!r} has {preset.n_params:,}"
        )
    return preset


def load_weights(model: GPT, weights: Iterable[tuple[str, torch.Tensor]]) -> GPT:
    """Put the named weights (any float dtype, upcast to float32) into `model`."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights:
            param = params.pop(name, None)
            if param is None or param.numel() != value.numel():
                raise ExportRefused(f"weight {name!r} does not fit the {model.preset.name} model")
            param.copy_(value.to(torch.float32).view_as(param))
    if params:
        raise ExportRefused(f"the weights lack {', '.join(sorted(params))}")
    return model


def flat_weights(model: GPT, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's weights region cut into the model's parameters (file order)."""
    offset = 0
    for name, param in model.named_parameters():
        yield name, flat[offset : offset + param.numel()].view_as(param)
        offset += param.numel()


def probe_batch(preset: Preset, arms: Sequence[str]) -> tuple[torch.Tensor, list[str]]:
    """PROBE_ROWS held-out sequences of each arm (never trained on; drawn as the trainer's
    validation batch 0 is): fixed for a given stdlib, so two exports of one checkpoint are
    measured on the same tokens."""
    available = build_arms(arms)
    rows = [
        validation_batch(as_tokens(arm.held_out), PROBE_SEED, 0, name, PROBE_ROWS, preset.seq_len)[
            0
        ]
        for name, arm in available.items()
    ]
    if not rows:
        raise ExportRefused(f"none of the data arms {', '.join(arms)} is available for a probe")
    return torch.cat(rows), list(available)


def _arms_of(path: Path) -> list[str]:
    try:
        saved = json.loads(sidecar_path(path).read_bytes())["data_fingerprint"]["arms"]
        return [name for name in saved if name in ARM_NAMES] or list(ARM_NAMES)
    except (OSError, ValueError, KeyError, TypeError):
        return list(ARM_NAMES)


def export_andrea_bin(path: Path, out: Path, dtype_name: str) -> dict[str, Any]:
    try:
        info = AndreaBin().verify(path)
    except CheckpointInvalid as exc:
        raise ExportRefused(f"refusing to export {path.name}: {exc}") from None
    assert info.n_params is not None
    preset = preset_of(path, info.n_params)
    reference = GPT(preset)
    load_weights(reference, flat_weights(reference, read_regions(path).weights))
    # named_parameters gives a tied weight once (lm_head is wte): stored once, as trained.
    tensors = cast(dict(reference.named_parameters()), dtype_name)
    weights_path = out / WEIGHTS_FILE
    write_safetensors(
        weights_path, tensors, {"format": "pt", "step": str(info.step), "source": path.name}
    )
    config = {
        "model": "trainwarden.trainer.model.GPT",
        "preset": preset.name,
        "vocab_size": preset.vocab_size,
        "d_model": preset.d_model,
        "n_layer": preset.n_layer,
        "n_head": preset.n_head,
        "seq_len": preset.seq_len,
        "tied": {"lm_head.weight": "wte.weight"},
        "dtype": dtype_name,
        "step": info.step,
        "n_params": info.n_params,
    }
    write_json_atomically(out / CONFIG_FILE, config)
    exported = load_weights(GPT(preset), read_safetensors(weights_path).items())
    tokens, arms = probe_batch(preset, _arms_of(path))
    with torch.no_grad():
        # A row at a time: gpt2-124m's logits for the whole probe would take gigabytes.
        difference = max(
            (reference(row) - exported(row)).abs().max().item() for row in tokens.split(1)
        )
    return {
        "format": "andrea-bin",
        "step": info.step,
        "n_params": info.n_params,
        "dtype": dtype_name,
        "resume_bytes": path.stat().st_size,
        "export_bytes": weights_path.stat().st_size,
        "files": [str(weights_path), str(out / CONFIG_FILE)],
        "logit_max_abs_diff": difference,
        "probe": {
            "arms": arms,
            "rows_per_arm": PROBE_ROWS,
            "seq_len": preset.seq_len,
            "split": "held_out",
        },
    }


# ----------------------------------------------------------------------------- hf-trainer


def hf_weight_files(path: Path) -> list[Path]:
    """model.safetensors, or every shard model.safetensors.index.json names (exported
    together as one file)."""
    if (path / WEIGHTS_FILE).is_file():
        return [path / WEIGHTS_FILE]
    try:
        weight_map = json.loads((path / WEIGHTS_INDEX).read_bytes())["weight_map"]
        return [path / shard for shard in sorted(set(weight_map.values()))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise ExportRefused(
            f"{path.name}: neither {WEIGHTS_FILE} nor a readable {WEIGHTS_INDEX}"
            " (only safetensors weights are exported)"
        ) from None


def export_hf_trainer(path: Path, out: Path, dtype_name: str) -> dict[str, Any]:
    tensors: dict[str, torch.Tensor] = {}
    for source in hf_weight_files(path):
        tensors.update(read_safetensors(source))
    tensors = cast(tensors, dtype_name)
    weights_path = out / WEIGHTS_FILE
    write_safetensors(weights_path, tensors, {"format": "pt", "source": path.name})
    files = [str(weights_path)]
    try:
        config = json.loads((path / CONFIG_FILE).read_bytes())
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict):
        config["torch_dtype"] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[
            dtype_name
        ]
        write_json_atomically(out / CONFIG_FILE, config)
        files.append(str(out / CONFIG_FILE))
    resume = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return {
        "format": "hf-trainer",
        "step": int(path.name.rpartition("-")[2]),
        "n_params": sum(t.numel() for t in tensors.values()),
        "dtype": dtype_name,
        "resume_bytes": resume,
        "export_bytes": weights_path.stat().st_size,
        "files": files,
        "logit_max_abs_diff": None,
        "probe": None,
    }


EXPORTERS = {"andrea-bin": export_andrea_bin, "hf-trainer": export_hf_trainer}
WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
"""Errors only writing causes: the export's folder is to blame, not the checkpoint."""


def _where(exc: OSError, out: Path, checkpoint: Path) -> str:
    """An OSError's one line, naming the side it happened on."""
    if exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    if exc.errno in WRITE_ERRORS:
        return f"{out}: {exc.strerror} while writing the export; free space there or choose another --out"
    return f"{checkpoint}: {exc.strerror}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainwarden.trainer.export")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--format", required=True, choices=sorted(EXPORTERS))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    args = parser.parse_args(argv)
    made = not args.out.exists()
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(
            f"trainwarden export: cannot create --out {args.out}: {exc.strerror or exc};"
            " choose a folder you can write",
            file=sys.stderr,
        )
        return 2
    try:
        report = EXPORTERS[args.format](args.checkpoint, args.out, args.dtype)
    except (TrainerError, OSError) as exc:
        # Leave no half export behind: OUT was empty (the command line checked).
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            for leftover in (args.out / name, args.out / f"{name}.tmp"):
                if leftover.is_file():
                    leftover.unlink()
        if made:
            with contextlib.suppress(OSError):  # not empty: something else is there now
                args.out.rmdir()
        if isinstance(exc, TrainerError):
            print(f"trainwarden export: {exc}", file=sys.stderr)
            return exc.exit_code
        print(f"trainwarden export: {_where(exc, args.out, args.checkpoint)}", file=sys.stderr)
        return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
