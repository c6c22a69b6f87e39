"""`trainwarden export`: a checkpoint's inference weights, written by the trainer side.

The command line checks what it can without torch (the checkpoint is verified now, not
quarantined, unchanged since its commit; OUT is new or empty; torch and safetensors are
installed), then runs `python -m trainwarden.trainer.export` in a child process: the
daemon's package never imports torch or the reference trainer, and the child's JSON report
is printed as it came.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainwarden.supervisor.cli.inspection import read_report, resolve
from trainwarden.supervisor.errors import CheckpointInvalid, TrainwardenError, UsageError

EXPORTABLE = ("andrea-bin", "hf-trainer")
EXPORT_MODULE = "trainwarden.trainer.export"


class ExportFailed(TrainwardenError):
    """The export child process failed; its one line is the message."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out}: already exists and is not an empty folder; choose a new --out")


def exportable(path: Path) -> dict[str, Any]:
    """The inspect report of a checkpoint that may be exported; refusals say why."""
    report = read_report(path)
    name = path.name
    if report["format"] not in EXPORTABLE:
        raise UsageError(
            f"{name}: {report['format']} checkpoints cannot be exported (only"
            f" {' and '.join(EXPORTABLE)})"
        )
    if report["quarantined"]:
        raise CheckpointInvalid(f"refusing to export {name}: it is quarantined")
    if report["check"] is not None and not report["check"]["ok"]:
        raise CheckpointInvalid(f"refusing to export {name}: {report['check']['reason']}")
    if report["digest_matches"] is False:
        raise CheckpointInvalid(
            f"refusing to export {name}: its digest differs from the one recorded at its commit"
            " (changed since)"
        )
    return report


def run_export(path: Path, fmt: str, out: Path, dtype: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", EXPORT_MODULE, str(path), "--format", fmt, "--out", str(out),
         "--dtype", dtype],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ExportFailed(
            last.removeprefix("trainwarden export: "), 2 if done.returncode == 2 else 1
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def format_export(r: dict[str, Any]) -> str:
    ratio = r["export_bytes"] / r["resume_bytes"] if r["resume_bytes"] else 0.0
    lines = [
        f"exported step {r['step']} ({r['format']}, {r['n_params']:,} parameters) as {r['dtype']}",
        *(f"  {f}" for f in r["files"]),
        f"resume file {r['resume_bytes']:,} bytes, export {r['export_bytes']:,} bytes"
        f" ({ratio:.3f} of it)",
    ]
    if r["logit_max_abs_diff"] is not None:
        probe = r["probe"]
        lines.append(
            f"max |logit difference| vs fp32: {r['logit_max_abs_diff']:.3g}"
            f" ({probe['rows_per_arm']} held-out sequences of {', '.join(probe['arms'])})"
        )
    else:
        lines.append("logit difference: not measured (only for the reference trainer's model)")
    return "\n".join(lines)


def cmd_export(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.output import print_json

    out = Path(args.out).expanduser().resolve()
    check_out(out)
    path = resolve(args.source, args.step, verified=True)
    report = exportable(path)
    missing = [m for m in ("torch", "safetensors") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"export needs {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed:"
            " pip install 'trainwarden[trainer]'"
        )
    result = run_export(path, report["format"], out, args.dtype)
    if args.json:
        print_json(result)
    else:
        print(format_export(result))
    return 0
