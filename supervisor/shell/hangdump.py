"""A stack dump of the trainer's process tree, to a file under RUN/.trainwarden/hangs/ and a
`hang_dump` journal record: before a hung trainer is stopped, and on an operator's `dump`."""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.inputs.proctree import descendants
from trainwarden.supervisor.inputs.stacks import StackDump, capture, find_py_spy
from trainwarden.supervisor.store.hangs import dump_path, write_dump
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.rundir import RunFiles

if TYPE_CHECKING:
    from trainwarden.supervisor.protocol import DumpResult

MARGIN_S = 0.5
"""Of the policy's dump time, left for writing the file and reporting back."""


async def dump_stacks(
    cfg: Config,
    files: RunFiles,
    journal: Journal,
    pid: int,
    step: int | None,
    timeout_s: float,
    reason: str,
) -> DumpResult:
    """Dump the stacks of `pid` and every process below it within `timeout_s` (in a thread:
    py-spy and /proc reads block), write them and journal `hang_dump`; its fields returned."""
    budget = max(0.1, timeout_s - min(MARGIN_S, timeout_s / 4))
    fields = await asyncio.to_thread(_dump, cfg, files, pid, step, budget, reason)
    journal.append({"kind": "hang_dump", **fields})
    return fields


def _dump(
    cfg: Config, files: RunFiles, pid: int, step: int | None, budget: float, reason: str
) -> DumpResult:
    started = time.monotonic()
    utc = time.time()
    pids = [pid, *descendants(pid)]
    py_spy = find_py_spy(cfg.restart.py_spy)
    missing = (
        f"py-spy not found at {cfg.restart.py_spy} ([restart] py_spy)"
        if cfg.restart.py_spy
        else "py-spy not found beside the daemon's Python nor on PATH (pip install py-spy)"
    )
    dump = capture(pids, py_spy, budget, missing)
    path = dump_path(files, utc, step)
    written: str | None = str(path)
    write_error = None
    try:
        write_dump(path, render(cfg, dump, utc, step, reason))
    except OSError as exc:
        written, write_error = None, f"{path}: {exc.strerror or exc}"
    fields: DumpResult = {
        "reason": reason,
        "step": step,
        "path": written,
        "top_frames": dump.top_frames,
        "error": dump.error,
        "pids": dump.pids,
        "seconds": round(time.monotonic() - started, 3),
    }
    if write_error is not None:
        fields["write_error"] = write_error
    return fields


def render(cfg: Config, dump: StackDump, utc: float, step: int | None, reason: str) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(utc))
    lines = [
        f"trainwarden stack dump of run {cfg.run.name} on {os.uname().nodename}, {when}",
        f"reason: {reason}; last step logged: {step if step is not None else 'none'}",
        f"processes: {' '.join(map(str, dump.pids))}",
        "",
    ]
    for process in dump.processes:
        lines.append(f"=== pid {process.pid}: {_cmdline(process.pid)}")
        if process.error is None:
            lines.append(process.python.rstrip())
        else:
            lines.append(f"(no Python stacks: {process.error})")
        lines += ["--- kernel: wait channel and stack of each thread", process.kernel, ""]
    return "\n".join(lines) + "\n"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(4096).replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(gone)"
