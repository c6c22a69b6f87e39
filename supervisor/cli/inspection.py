"""`trainwarden inspect`: what one checkpoint holds, read from its files without a daemon.

Nothing here imports torch: andrea-bin's layout is the contract's, a safetensors header
is 8 bytes of length plus JSON, and everything else (a pickle) is named as unknown. The
digest is taken again and set against the one the daemon journaled at the commit, so a
file changed since then reads as such.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwarden.plugins.formats import hf_trainer
from trainwarden.supervisor.cli import inspect_formats as formats
from trainwarden.supervisor.config import CONFIG_NAME, load_config
from trainwarden.supervisor.contract import (
    sidecar_path,
    step_of_name,
)
from trainwarden.supervisor.errors import UsageError
from trainwarden.supervisor.store.branches import BranchFileInvalid, read_branch
from trainwarden.supervisor.store.checkpoints import QUARANTINE
from trainwarden.supervisor.store.digest import digest_checkpoint
from trainwarden.supervisor.store.rundir import RunFiles
from trainwarden.supervisor.store.verdicts import JournalVerdicts, read_verdicts

DIGEST_PREFIX = "xxh3:"
"""How branch.json may spell a digest (store.branches); the journal's is the bare hex."""
RUN_DEPTH = 3
"""How many folders above a checkpoint its run directory may be (RUN/checkpoints/quarantine/x)."""


@dataclass(frozen=True)
class Located:
    """A checkpoint path with the run it belongs to, when one is found above it."""

    path: Path
    format: str
    run_dir: Path | None
    quarantined: bool
    options: dict[str, Any]
    """The run's `[checkpoints] options` (the format's own settings), {} without a run."""


def run_of(path: Path) -> Path | None:
    """The run directory holding `path` (the nearest folder above with a trainwarden.toml)."""
    for parent in list(path.parents)[:RUN_DEPTH]:
        if (parent / CONFIG_NAME).is_file():
            return parent
    return None


def sniff_format(path: Path) -> str | None:
    """The format a checkpoint's name and shape say, when no run configures one."""
    if path.is_dir():
        return (
            "hf-trainer"
            if hf_trainer.NAME.match(path.name) and (path / hf_trainer.TRAINER_STATE).is_file()
            else None
        )
    if step_of_name(path.name) is not None:
        return "andrea-bin"
    if path.suffix in (".pt", ".pth", ".ckpt"):
        return "torch-pt"
    return None


def locate(path: Path) -> Located:
    """Raises UsageError when `path` is missing or names no checkpoint format."""
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or folder; give a checkpoint's path")
    run_dir = run_of(path)
    fmt, options = None, {}
    if run_dir is not None:
        checkpoints = load_config(run_dir, check_plugins=False).checkpoints
        fmt, options = checkpoints.format, dict(checkpoints.options)
    fmt = fmt or sniff_format(path)
    if fmt is None or (fmt == "andrea-bin" and step_of_name(path.name) is None):
        raise UsageError(
            f"{path}: not a checkpoint (andrea-bin step_NNNNNN.bin, an hf-trainer checkpoint-N/"
            " folder or a torch .pt file)"
        )
    return Located(path, fmt, run_dir, path.parent.name == QUARANTINE, options)


def inspect_checkpoint(path: Path) -> dict[str, Any]:
    """The inspect report of one checkpoint (its JSON shape is the `--json` output)."""
    where = locate(path)
    journal = read_verdicts(RunFiles(where.run_dir).journal) if where.run_dir else None
    files = _files(where)
    report: dict[str, Any] = {
        "path": str(path),
        "format": where.format,
        "run_dir": str(where.run_dir) if where.run_dir else None,
        # Also a file the journal quarantined whose move out of the folder failed: the
        # daemon's next start, and `branch`, hold it quarantined as well.
        "quarantined": where.quarantined
        or (journal is not None and journal.refused(path.name) is not None),
        "files": [{"name": name, "bytes": size} for name, size in files],
        "bytes": sum(size for _, size in files),
        "step": None,
        "n_params": None,
        "weights_numel": None,
        "optimizer_numel": None,
        "optimizer_ratio": None,
        "regions": None,
        "tensors": None,
        "check": None,
        "sidecar": None,
        "branch": None,
    }
    if where.format == "andrea-bin":
        report.update(formats.andrea_bin(path))
    elif where.format == "hf-trainer":
        report.update(formats.hf_trainer_folder(path, where.options))
    elif where.format == "torch-pt":
        report.update(formats.torch_pt(path, where.options))
    report.update(_digests(where, journal))
    report["branch"] = _branch(where.run_dir, path.name, report["digest"])
    report["unknown"] = sorted(
        k
        for k, v in report.items()
        if v is None and k in KNOWABLE and k not in NOT_APPLICABLE.get(where.format, ())
    )
    return report


KNOWABLE = (
    "step",
    "n_params",
    "weights_numel",
    "optimizer_numel",
    "optimizer_ratio",
    "regions",
    "tensors",
    "check",
    "sidecar",
    "recorded_digest",
)
"""Fields a format may leave unknown: listed by name in the report's `unknown`."""
NOT_APPLICABLE = {
    "andrea-bin": ("tensors",),
    "hf-trainer": ("regions", "sidecar"),
    "torch-pt": ("regions", "sidecar"),
}
"""Fields a format has no such thing for (andrea-bin has regions, not named tensors)."""


def _paths(where: Located) -> list[Path]:
    """The checkpoint's main path and the companion beside it (andrea-bin's sidecar)."""
    paths = [where.path]
    if where.format == "andrea-bin" and sidecar_path(where.path).exists():
        paths.append(sidecar_path(where.path))
    return paths


def _files(where: Located) -> list[tuple[str, int]]:
    found = []
    for path in _paths(where):
        if path.is_dir():
            found += [
                (f"{path.name}/{p.relative_to(path).as_posix()}", p.stat().st_size)
                for p in sorted(path.rglob("*"))
                if p.is_file() and not p.is_symlink()
            ]
        else:
            found.append((path.name, path.stat().st_size))
    return found


def _digests(where: Located, journal: JournalVerdicts | None) -> dict[str, Any]:
    digest = digest_checkpoint(_paths(where)).hex
    recorded = (
        journal.committed_digest(where.path.name, in_quarantine=where.quarantined)
        if journal is not None
        else None
    )
    return {
        "digest": digest,
        "recorded_digest": recorded,
        "digest_matches": None if recorded is None else recorded == digest,
    }


def _branch(run_dir: Path | None, name: str, digest: str) -> dict[str, Any] | None:
    """The run's branch record; for the checkpoint the branch was made from (its copy in
    the branch), also whether this file still reads as the parent's did."""
    if run_dir is None:
        return None
    try:
        info = read_branch(run_dir)
    except BranchFileInvalid as exc:
        return {"error": str(exc)}
    if info is None:
        return None
    record = info.to_json()
    if name == info.checkpoint and info.digest is not None:
        record["matches_parent"] = info.digest.removeprefix(DIGEST_PREFIX) == digest
    return record


def read_report(path: Path) -> dict[str, Any]:
    """inspect_checkpoint, a read failing in one line (a folder under a file's name, a file
    gone while it was read)."""
    try:
        return inspect_checkpoint(path)
    except OSError as exc:
        raise UsageError(f"{exc.filename or path}: cannot read: {exc.strerror or exc}") from None


def checkpoint_in_run(run_dir: Path, step: int | None, *, verified: bool) -> Path:
    """The run's checkpoint of `step` (None: its newest), read from the directory and the
    journal as `trainwarden checkpoints` does offline; UsageError names what there is."""
    from trainwarden.supervisor.cli.offline import checkpoints_from_directory

    listed = checkpoints_from_directory(run_dir)["checkpoints"]
    candidates = [c for c in listed if c["verified"] or not verified]
    kind = "verified checkpoint" if verified else "checkpoint"
    if step is None:
        if not candidates:
            raise UsageError(f"{run_dir}: no {kind} yet (see `trainwarden checkpoints`)")
        return Path(candidates[-1]["path"])
    chosen = [c for c in candidates if c["step"] == step]
    if not chosen:
        steps = ", ".join(str(c["step"]) for c in candidates) or "none"
        raise UsageError(f"{run_dir}: no {kind} of step {step} (there: {steps})")
    return Path(chosen[0]["path"])


def resolve(target: str, step: int | None, *, verified: bool) -> Path:
    """CHECKPOINT as given on the command line: a checkpoint's path, or a run directory
    (its newest checkpoint, or the one of --step)."""
    path = Path(target).expanduser().resolve()
    if path.is_dir() and (path / CONFIG_NAME).is_file():
        return checkpoint_in_run(path, step, verified=verified)
    if step is not None:
        raise UsageError(f"{target}: --step needs a run directory, not a checkpoint")
    return path


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for larger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.1f} {unit}"


def format_inspect(r: dict[str, Any]) -> str:
    def known(value: Any, text: str | None = None) -> str:
        return "unknown" if value is None else (text or str(value))

    def count(value: int | None, unit: str = "") -> str:
        return "unknown" if value is None else f"{value:,}{unit}"

    lines = [f"checkpoint  {r['path']}"]
    lines.append(f"format      {r['format']}" + ("  (quarantined)" if r["quarantined"] else ""))
    lines.append(f"step        {known(r['step'])}")
    check = r["check"]
    lines.append(
        "check       "
        + (
            "not run for this format"
            if check is None
            else "ok"
            if check["ok"]
            else f"FAILED: {check['reason']}"
        )
    )
    lines.append(f"parameters  {count(r['n_params'])}")
    lines.append(f"weights     {count(r['weights_numel'], ' values')}")
    ratio = r["optimizer_ratio"]
    optimizer = (
        f"{r['optimizer_numel']:,} values ({ratio:g} x the weights)" if ratio is not None else None
    )
    lines.append(f"optimizer   {known(r['optimizer_numel'], optimizer)}")
    if r["regions"]:
        lines.append("regions     offset       bytes")
        lines += [
            f"  {g['name']:<10}{g['offset']:>8}  {g['bytes']:>10}  ({_size(g['bytes'])})"
            for g in r["regions"]
        ]
    if r["tensors"]:
        t = r["tensors"]
        dtypes = ", ".join(f"{k} x {v}" for k, v in sorted(t["dtypes"].items()))
        lines.append(
            f"tensors     {t['count']} in {', '.join(t['files'])}, {t['numel']:,} values ({dtypes})"
        )
    lines.append(f"files       {len(r['files'])}, {r['bytes']} bytes ({_size(r['bytes'])})")
    lines += [f"  {f['name']}  {f['bytes']}" for f in r["files"]]
    match = {None: "not recorded", True: "matches the commit", False: "DIFFERS from the commit"}
    lines.append(f"digest      {r['digest']} ({match[r['digest_matches']]})")
    if r["digest_matches"] is False:
        lines.append(f"  recorded  {r['recorded_digest']}")
    if r["sidecar"]:
        s = r["sidecar"]
        fingerprint = s["data_fingerprint"] or {}
        arms = fingerprint.get("arms") or {}
        lines.append("data        " + (", ".join(f"{k} {v}" for k, v in arms.items()) or "unknown"))
        bandit = s["bandit"]
        if bandit is None:
            lines.append("bandit      none in the sidecar")
        else:
            pulls = ", ".join(f"{k} {v}" for k, v in bandit["pulls"].items())
            lines.append(
                f"bandit      {bandit['algorithm']}, pulls: {pulls or 'none'},"
                f" pivots {bandit['pivots']}"
            )
    if r["branch"]:
        b = r["branch"]
        if "error" in b:
            lines.append(f"branch      unreadable: {b['error']}")
        else:
            lines.append(
                f"branch      of {b['parent']} at step {b['step']} ({b['checkpoint']}, digest {b['digest']})"
            )
            if "matches_parent" in b:
                same = "the same" if b["matches_parent"] else "NOT the same"
                lines.append(f"  this file reads {same} as the parent's checkpoint did")
    if r["unknown"]:
        lines.append(f"unknown     {', '.join(r['unknown'])}")
    return "\n".join(lines)


def cmd_inspect(args: Any) -> int:
    from trainwarden.supervisor.cli.output import print_json

    report = read_report(resolve(args.checkpoint, args.step, verified=False))
    if args.json:
        print_json(report)
    else:
        print(format_inspect(report))
    return 0
