"""Run every comparison and write RESULTS.md, results.json and the plots.

    python -m bench [--quick] [--out DIR] [--only KEY,...]

Full mode takes under 13 minutes on 2 CPU cores without a GPU (3 of them the 18M-step
history of long_runs); --quick (fewer samples, shorter windows, smaller files) under 2
minutes, for CI to keep the suite working.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench import (
    alert_bounds,
    checkpoint_stall,
    checkpoint_verify,
    checkpoint_write,
    control_load,
    divergence,
    follow_rates,
    history,
    history_of_load,
    long_runs,
    overhead,
    parse_suite,
    report,
    restart,
    spikes,
    torch_verify,
)
from bench.common import Context, Section, Workspace, machine
from bench.peers import Peers

COMPARISONS: dict[str, tuple[str, Callable[[Context], Section]]] = {
    "restart": (restart.TITLE, restart.run),
    "divergence": (divergence.TITLE, divergence.run),
    "overhead": (overhead.TITLE, overhead.run),
    "history": (history.TITLE, history.run),
    "checkpoint": (checkpoint_write.TITLE, checkpoint_write.run),
    "verify": (checkpoint_verify.TITLE, checkpoint_verify.run),
    "parse": (parse_suite.TITLE, parse_suite.run),
    "follow": (follow_rates.TITLE, follow_rates.run),
    "torch-verify": (torch_verify.TITLE, torch_verify.run),
    "long-runs": (long_runs.TITLE, long_runs.run),
    "control-load": (control_load.TITLE, control_load.run),
    "spikes": (spikes.TITLE, spikes.run),
    "stall": (checkpoint_stall.TITLE, checkpoint_stall.run),
    "history-of-load": (history_of_load.TITLE, history_of_load.run),
    "alert-bounds": (alert_bounds.TITLE, alert_bounds.run),
}


def _terminate(signum: int, _frame: object) -> None:
    # Unwind through the finally blocks so every process we started is stopped.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, for CI (< 2 min)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent,
        help="where RESULTS.md, results.json and the PNGs go (default: bench/)",
    )
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated subset of: {', '.join(COMPARISONS)} (default: all)",
    )
    args = parser.parse_args(argv)
    chosen = [k.strip() for k in args.only.split(",") if k.strip()] or list(COMPARISONS)
    unknown = [k for k in chosen if k not in COMPARISONS]
    if unknown:
        parser.error(f"unknown comparison(s) {', '.join(unknown)}; known: {', '.join(COMPARISONS)}")
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _terminate)

    started = time.monotonic()
    meta = {
        "command": shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)]),
        "mode": "quick" if args.quick else "full",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
    }
    sections: list[Section] = []
    failed = []
    work = Workspace()
    try:
        ctx = Context(quick=args.quick, out=out, work=work)
        ctx.peers = Peers(work)
        for key in chosen:
            title, run = COMPARISONS[key]
            print(f"[bench] {title} ...", flush=True)
            t0 = time.monotonic()
            try:
                section = run(ctx)
            except Exception as exc:
                failed.append(key)
                traceback.print_exc()
                section = Section(key=key, title=title, intro="")
                section.notes.append(f"This comparison failed: {type(exc).__name__}: {exc}")
            section.seconds = time.monotonic() - t0
            sections.append(section)
            print(f"[bench]   done in {section.seconds:.0f} s", flush=True)
        meta["peers"] = ctx.peers.versions()
    finally:
        work.close()
    meta["seconds"] = time.monotonic() - started
    report.write(out, sections, meta)
    print(f"[bench] wrote {out / 'RESULTS.md'} in {meta['seconds']:.0f} s", flush=True)
    if failed:
        print(f"[bench] failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
