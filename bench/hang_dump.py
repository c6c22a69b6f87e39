"""Hang -> stack dump -> SIGTERM: how long the dump takes and how late it makes the kill.

    python -m bench.hang_dump [--runs N]

A trainer that logs three steps and then sleeps inside `stuck_in_data_loader` is supervised
with stall_timeout_s = 3 and dump_timeout_s = 10 (the default). For each run: the dump's own
seconds (py-spy and /proc, from the hang_dump record), the SIGTERM's delay after the stall
record, and after the last step line (the target: at most stall_timeout_s + dump_timeout_s).
Then the same for the reference trainer (torch imported: more threads, a bigger process).
Standalone, not part of `python -m bench`: its figures are printed, not written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from tests.support.daemon import running_daemon
from tests.support.runs import PYTHON, journal, make_run, reference_run
from tests.support.wait import wait_for

STALL_S = 3.0
DUMP_S = 10.0
STUCK = """\
import time

def stuck_in_data_loader():
    while True:
        time.sleep(60)

for step in range(1, 4):
    time.sleep(0.1)
    print(f"step: {step}, loss: 3.0, dt: 0.1", flush=True)
stuck_in_data_loader()
"""


def first(run_dir: Path, kind: str, **match: object) -> dict:
    for record in journal(run_dir):
        if record["kind"] == kind and all(record.get(k) == v for k, v in match.items()):
            return record
    raise LookupError(kind)


def one(run_dir: Path) -> dict[str, float]:
    with running_daemon(run_dir):
        wait_for(lambda: any(r["kind"] == "crash" for r in journal(run_dir)), 180)
        stall = first(run_dir, "stall")
        dumped = first(run_dir, "hang_dump")
        sigterm = first(run_dir, "signal", signal="SIGTERM")
    return {
        "dump_s": dumped["seconds"],
        "sigterm_after_stall_s": sigterm["t"] - stall["t"],
        "named_function": float(bool(dumped["top_frames"])),
    }


def stuck_run(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "stuck.py").write_text(STUCK)
    return make_run(
        run_dir,
        [PYTHON, "stuck.py"],
        trainer={"stop_timeout_s": 5.0},
        restart={
            "stall_timeout_s": STALL_S,
            "dump_timeout_s": DUMP_S,
            "backoff_initial_s": 60.0,
            "backoff_max_s": 60.0,
        },
    )


def hung_reference_run(run_dir: Path) -> Path:
    return reference_run(
        run_dir,
        60,
        10,
        "--hang-at-step",
        "5",
        restart={
            "stall_timeout_s": STALL_S,
            "dump_timeout_s": DUMP_S,
            "backoff_initial_s": 60.0,
            "backoff_max_s": 60.0,
        },
        trainer={"stop_timeout_s": 5.0},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for name, make in (
        ("scripted stuck trainer", stuck_run),
        ("reference trainer", hung_reference_run),
    ):
        rows = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(one(make(Path(tmp) / f"run{i}")))
        for key in ("dump_s", "sigterm_after_stall_s"):
            values = [r[key] for r in rows]
            print(
                f"{name:24} {key:24} median {statistics.median(values):.3f} s"
                f"  max {max(values):.3f} s  (bound {DUMP_S:g} s)"
            )
        print(
            f"{name:24} named a Python function in {sum(r['named_function'] for r in rows):.0f}/{len(rows)}"
        )


if __name__ == "__main__":
    main()
