"""What each format's files say, for `trainwarden inspect`, read without torch: andrea-bin's
header and the regions it promises (with the sidecar's bandit), an hf-trainer folder's
safetensors tensors (their count, size and dtypes), a torch file's step from its name
(the file is a pickle, known only to torch); and the format's verification run again."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainwarden.plugins.api import CheckpointInvalid
from trainwarden.plugins.formats import hf_trainer
from trainwarden.plugins.formats.andrea_bin import AndreaBin
from trainwarden.plugins.formats.hf_trainer import HfTrainer, read_safetensors_header
from trainwarden.plugins.formats.torch_pt import DEFAULT_PATTERN as TORCH_PT_PATTERN
from trainwarden.supervisor.contract import (
    ANDREA_BIN_HEADER,
    ANDREA_BIN_REGIONS,
    LIGHTNING_CHECKPOINT_PATTERN,
    sidecar_path,
)

FLOAT_BYTES = 4


def andrea_bin(path: Path) -> dict[str, Any]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(ANDREA_BIN_HEADER.size)
    out: dict[str, Any] = {"check": check(AndreaBin(), path)}
    if len(head) < ANDREA_BIN_HEADER.size:
        return out
    step, n_params = ANDREA_BIN_HEADER.unpack(head)
    regions: list[dict[str, Any]] = [
        {"name": "header", "offset": 0, "bytes": ANDREA_BIN_HEADER.size}
    ]
    end = ANDREA_BIN_HEADER.size
    for region in ANDREA_BIN_REGIONS:
        regions.append({"name": region, "offset": end, "bytes": FLOAT_BYTES * max(n_params, 0)})
        end += FLOAT_BYTES * max(n_params, 0)
    if end != size:  # what the header promises against what is there
        regions.append(
            {
                "name": "beyond the regions" if size > end else "missing",
                "offset": min(size, end),
                "bytes": abs(size - end),
            }
        )
    # Adam m and v: one value per weight each. A header with n_params <= 0 says nothing.
    weights = n_params if n_params > 0 else None
    optimizer = (len(ANDREA_BIN_REGIONS) - 1) * n_params if n_params > 0 else None
    out.update(
        step=step,
        n_params=n_params,
        weights_numel=weights,
        optimizer_numel=optimizer,
        optimizer_ratio=optimizer / n_params if optimizer is not None else None,
        regions=regions,
        sidecar=_sidecar(sidecar_path(path)),
    )
    return out


def _sidecar(path: Path) -> dict[str, Any] | None:
    try:
        sidecar = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(sidecar, dict):
        return None
    bandit = _dict(sidecar.get("bandit"))
    arms = {name: _dict(arm) for name, arm in _dict(bandit.get("arms")).items()}
    return {
        "preset": sidecar.get("preset"),
        "data_fingerprint": sidecar.get("data_fingerprint"),
        "bandit": {
            "algorithm": bandit.get("algorithm"),
            "pulls": {name: arm.get("pulls") for name, arm in arms.items()},
            "ema_reward": {name: arm.get("ema_reward") for name, arm in arms.items()},
            "pivots": _dict(bandit.get("phase")).get("pivots"),
            "policy": bandit.get("policy"),
            "zombies": bandit.get("zombies") or [],
        }
        if bandit
        else None,
    }


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def hf_trainer_folder(path: Path, options: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"check": check(HfTrainer(options), path)}
    match = hf_trainer.NAME.match(path.name)
    out["step"] = int(match.group(1)) if match else None
    files = _weight_files(path)
    dtypes: dict[str, int] = {}
    numel = 0
    try:
        for weights in files:
            header, count = read_safetensors_header(weights)
            numel += count
            for name, entry in header.items():
                if name != "__metadata__":
                    dtypes[entry["dtype"]] = dtypes.get(entry["dtype"], 0) + 1
    except CheckpointInvalid:
        return out  # the check says what is wrong with it
    if files:
        out.update(
            n_params=numel,
            weights_numel=numel,
            tensors={
                "files": [f.name for f in files],
                "count": sum(dtypes.values()),
                "numel": numel,
                "dtypes": dtypes,
            },
        )
    return out


def _weight_files(path: Path) -> list[Path]:
    """The folder's safetensors weights: the one file, or the shards its index names."""
    single = [path / n for n in hf_trainer.SINGLE_WEIGHTS if (path / n).is_file()]
    if single:
        return single[:1]
    try:
        weight_map = json.loads((path / hf_trainer.WEIGHTS_INDEX).read_bytes())["weight_map"]
        return [path / shard for shard in sorted(set(weight_map.values()))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def torch_pt(path: Path, options: dict[str, Any]) -> dict[str, Any]:
    """Only the step, from the name: the file is a pickle, known only to torch."""
    pattern = options.get("pattern") or (
        LIGHTNING_CHECKPOINT_PATTERN if options.get("preset") == "lightning" else TORCH_PT_PATTERN
    )
    try:
        match = re.match(pattern, path.name)
    except (re.error, TypeError):
        match = None
    return {"step": int(match.group(1)) if match else None}


def check(fmt: AndreaBin | HfTrainer, path: Path) -> dict[str, Any]:
    """The format's verification, run again now."""
    try:
        fmt.verify(path)
    except CheckpointInvalid as exc:
        return {"ok": False, "reason": str(exc)}
    return {"ok": True, "reason": None}
