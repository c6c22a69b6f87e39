"""The chaos soak's independent witness: a separate process that samples the run all along.

    python -m tests.chaos.watcher --checkpoints DIR --run-dir RUN --out FILE [--threshold N]

Every few milliseconds it lists the checkpoint directory and verifies each committed
`step_NNNNNN.bin` itself (size against the header, header step against the name,
n_params > 0: its own code, not the daemon's), tails RUN/training.log for the trainer's
fault lines, and every 100 ms scans /proc for reference trainers whose working directory
is the run (tests.support's ownership check) and for every process of one of the run's
starts: the daemon marks each start's processes with TRAINWARDEN_START in their environment
(beside TRAINWARDEN_RUN_DIR), inherited by every fork, setsid and exec. It also tails the
daemon's journal, and the moment it reads a `spawn` or `trainer_started` record it lists
the run's processes that carry another start's marker. It writes JSON lines to FILE:

    first_commit  the first verified checkpoint appeared
    no_verified   a sample with committed files but none verified, after the first commit
    over          a sample with more than --threshold committed files (names listed)
    gone          a committed file disappeared: was it verified, did it reach quarantine/,
                  which newer verified checkpoints existed at that moment
    log           a trainer line that marks a fault (NaN loss, injected hang, a traceback)
    two_trainers  two reference trainers alive in the run directory at once
    at_spawn      for each journal `spawn`/`trainer_started` record as soon as it is read:
                  its marker and the processes of other starts alive then (`older`)
    two_starts    processes of two starts alive at one instant (each seen alive in two
                  passes over the table, so they overlapped between the passes)
    two_run_trainers  two reference trainers carrying this run's markers, alive at once
                  (confirmed the same way)
    stats         on exit (SIGTERM): samples taken, the extremes seen

It never writes into the run directory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import stat
import struct
import sys
import time
from pathlib import Path

from tests.support.procs import argv_of, belongs_to_run, runs_a_trainer

NAME = re.compile(r"^step_(\d{6,})\.bin$")
HEADER = struct.Struct("<ii")
FAULT_LINE = re.compile(
    r"loss: (?:-?nan|-?inf)\b|injected (?:hang|crash)|Traceback|No space left|OSError"
)


def verified(
    path: str, name_step: int, cache: dict[str, tuple[tuple[int, ...], bool]]
) -> bool | None:
    """The andrea-bin rule: a regular file, size 8 + 12 n, header step = name step, n > 0.

    The header is read again only when lstat says the file changed: every open would wake
    the daemon's inotify watch (IN_OPEN, IN_CLOSE_NOWRITE) and make the watcher a load.
    None: the file vanished while it was being looked at (deleted or moved meanwhile).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
    known = cache.get(path)
    if known is not None and known[0] == key:
        return known[1]
    ok = False
    if stat.S_ISREG(st.st_mode):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                head = os.read(fd, HEADER.size)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except OSError:
            head = b""
        if len(head) == HEADER.size:
            step, n_params = HEADER.unpack(head)
            ok = n_params > 0 and step == name_step and st.st_size == HEADER.size + 12 * n_params
    cache[path] = (key, ok)
    return ok


START_ENV = b"TRAINWARDEN_START="
RUN_DIR_ENV = b"TRAINWARDEN_RUN_DIR="


def start_marker(pid: int, run_dir: str) -> str | None:
    """The TRAINWARDEN_START marker of a live process of the run in `run_dir` (None: not
    one; a zombie's environ reads empty, so an exited process is never one)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return None
    marker = None
    ours = False
    for entry in environ.split(b"\0"):
        if entry.startswith(START_ENV):
            marker = entry[len(START_ENV) :].decode(errors="replace")
        elif entry.startswith(RUN_DIR_ENV):
            path = entry[len(RUN_DIR_ENV) :].decode(errors="replace")
            ours = path == run_dir or path.startswith(run_dir + "/")
    return marker if ours else None


def run_processes(run_dir: str) -> list[dict[str, object]]:
    """Every live process of one of the run's starts: pid, marker, whether it runs the
    reference trainer, and its command line (shortened)."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        marker = start_marker(pid, run_dir)
        if marker is None:
            continue
        argv = argv_of(pid)
        found.append(
            {
                "pid": pid,
                "marker": marker,
                "trainer": runs_a_trainer(argv),
                "cmdline": b" ".join(argv).decode(errors="replace")[:200],
            }
        )
    return found


def still_there(procs: list[dict[str, object]], run_dir: str) -> list[dict[str, object]]:
    """Those of `procs` alive now with the same marker."""
    return [p for p in procs if start_marker(int(p["pid"]), run_dir) == p["marker"]]  # type: ignore[call-overload]


class Watcher:
    def __init__(self, args: argparse.Namespace) -> None:
        self.ckpt_dir = args.checkpoints
        self.quarantine_dir = os.path.join(self.ckpt_dir, "quarantine")
        self.run_dir = os.path.realpath(args.run_dir)
        self.run_path = Path(self.run_dir)
        self.log_path = os.path.join(self.run_dir, "training.log")
        self.threshold = args.threshold
        self.interval_s = args.interval_ms / 1000.0
        self.out = open(args.out, "a", buffering=1)  # noqa: SIM115 (closed in run())
        self.log_offset = 0
        self.verify_cache: dict[str, tuple[tuple[int, ...], bool]] = {}
        self.log_partial = b""
        self.first_commit = False
        self.previous: dict[str, bool] = {}
        self.quarantine_counts: dict[str, int] = {}
        self.last_over: tuple[str, ...] = ()
        self.in_no_verified = False
        self.samples = 0
        self.max_committed = 0
        self.min_verified: int | None = None
        self.proc_scans = 0
        self.max_trainers = 0
        self.journal_path = os.path.join(self.run_dir, ".trainwarden", "journal.jsonl")
        self.journal_offset = 0
        self.journal_partial = b""
        self.spawn_checks = 0
        self.markers_seen: set[str] = set()
        self.others_seen: set[int] = set()
        self.last_two_starts: tuple[str, ...] = ()
        self.last_two_trainers: tuple[int, ...] = ()
        self.stopping = False

    def emit(self, kind: str, **fields: object) -> None:
        self.out.write(json.dumps({"kind": kind, "t": time.time(), **fields}) + "\n")

    # ------------------------------------------------------------------ checkpoints

    def quarantined(self, name: str) -> int:
        try:
            entries = os.listdir(self.quarantine_dir)
        except OSError:
            return 0
        return sum(1 for e in entries if e == name or e.startswith(name + "."))

    def listing(self) -> tuple[dict[str, bool], dict[str, int]] | None:
        try:
            names = os.listdir(self.ckpt_dir)
        except OSError:
            return None
        now: dict[str, bool] = {}
        steps: dict[str, int] = {}
        for name in names:
            match = NAME.match(name)
            if match is None:
                continue
            step = int(match.group(1))
            ok = verified(os.path.join(self.ckpt_dir, name), step, self.verify_cache)
            if ok is None:
                continue
            steps[name] = step
            now[name] = ok
        return now, steps

    def sample_checkpoints(self) -> None:
        listed = self.listing()
        if listed is None:
            return
        now, steps = listed
        if any(name not in now for name in self.previous):
            # readdir during a concurrent rename or unlink may miss entries: look again,
            # and believe a disappearance only when the name is really gone.
            listed = self.listing()
            if listed is None:
                return
            now, steps = listed
            for name in self.previous:
                if name not in now and os.path.lexists(os.path.join(self.ckpt_dir, name)):
                    now[name] = self.previous[name]
                    steps[name] = int(NAME.match(name).group(1))  # type: ignore[union-attr]
        self.samples += 1
        good = sorted(steps[n] for n, ok in now.items() if ok)
        if good and not self.first_commit:
            self.first_commit = True
            self.emit("first_commit", names=sorted(now))
        for name, was_verified in self.previous.items():
            if name in now:
                continue
            step = int(NAME.match(name).group(1))  # type: ignore[union-attr]
            count = self.quarantined(name)
            moved = count > self.quarantine_counts.get(name, 0)
            self.quarantine_counts[name] = count
            self.emit(
                "gone",
                name=name,
                step=step,
                verified=was_verified,
                quarantined=moved,
                newer_verified=[s for s in good if s > step],
                verified_now=good,
            )
        for name in now:
            if name not in self.previous:
                self.quarantine_counts[name] = self.quarantined(name)
        self.previous = now
        self.max_committed = max(self.max_committed, len(now))
        if self.first_commit:
            self.min_verified = (
                len(good) if self.min_verified is None else min(self.min_verified, len(good))
            )
            if not good and not self.in_no_verified:
                self.emit("no_verified", names=sorted(now))
            elif good and self.in_no_verified:
                self.emit("verified_again", names=sorted(now))
            self.in_no_verified = not good
        if len(now) > self.threshold:
            key = tuple(sorted(now))
            if key != self.last_over:
                self.emit("over", names=list(key), verified=good)
            self.last_over = key
        else:
            self.last_over = ()

    # ------------------------------------------------------------------ log

    def sample_log(self) -> None:
        try:
            if os.stat(self.log_path).st_size <= self.log_offset:
                return
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                data = f.read()
        except OSError:
            return
        if not data:
            return
        self.log_offset += len(data)
        data = self.log_partial + data
        *lines, self.log_partial = data.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if FAULT_LINE.search(line):
                self.emit("log", text=line[:300])

    # ------------------------------------------------------------------ processes

    def sample_processes(self) -> None:
        trainers = [
            int(entry)
            for entry in os.listdir("/proc")
            if entry.isdigit()
            and runs_a_trainer(argv_of(int(entry)))
            and belongs_to_run(int(entry), self.run_path)
        ]
        self.proc_scans += 1
        self.max_trainers = max(self.max_trainers, len(trainers))
        if len(trainers) > 1:
            self.emit("two_trainers", pids=trainers)

    def sample_starts(self) -> None:
        """Processes of two starts, or two trainers of the run, alive at the same instant."""
        procs = run_processes(self.run_dir)
        for p in procs:
            self.markers_seen.add(str(p["marker"]))
            if not p["trainer"]:
                self.others_seen.add(int(p["pid"]))  # type: ignore[call-overload]
        markers = {p["marker"] for p in procs}
        trainers = [p for p in procs if p["trainer"]]
        if len(markers) < 2 and len(trainers) < 2:
            self.last_two_starts = ()
            self.last_two_trainers = ()
            return
        # One pass over /proc is no snapshot: a process seen early may have gone before a
        # later one began. Seen alive in two further passes, two processes were alive at
        # once (between the passes).
        confirmed = still_there(still_there(procs, self.run_dir), self.run_dir)
        by_marker: dict[str, list[int]] = {}
        for p in confirmed:
            by_marker.setdefault(str(p["marker"]), []).append(int(p["pid"]))  # type: ignore[call-overload]
        key = tuple(sorted(by_marker))
        if len(by_marker) > 1 and key != self.last_two_starts:
            self.emit("two_starts", markers=by_marker, procs=confirmed)
        self.last_two_starts = key if len(by_marker) > 1 else ()
        both = [p for p in confirmed if p["trainer"]]
        pids = tuple(sorted(int(p["pid"]) for p in both))  # type: ignore[call-overload]
        if len(both) > 1 and pids != self.last_two_trainers:
            self.emit("two_run_trainers", procs=both)
        self.last_two_trainers = pids if len(both) > 1 else ()

    # ------------------------------------------------------------------ journal

    def sample_journal(self) -> None:
        """At each new spawn/trainer_started record: which other starts' processes live."""
        try:
            if os.stat(self.journal_path).st_size <= self.journal_offset:
                return
            with open(self.journal_path, "rb") as f:
                f.seek(self.journal_offset)
                data = f.read()
        except OSError:
            return
        self.journal_offset += len(data)
        *lines, self.journal_partial = (self.journal_partial + data).split(b"\n")
        starts = []
        for raw in lines:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("kind") in ("spawn", "trainer_started"):
                starts.append(record)
        if not starts:
            return
        # Only the newest start read now can be checked: an earlier one in the same read
        # is over (its processes are older than the newest start's, not newer).
        record = starts[-1]
        marker = record.get("marker")
        procs = run_processes(self.run_dir)
        self.spawn_checks += 1
        self.emit(
            "at_spawn",
            record=record["kind"],
            record_t=record.get("t"),
            seg=record.get("seg"),
            marker=marker,
            older=[p for p in procs if p["marker"] != marker],
            same=sum(1 for p in procs if p["marker"] == marker),
            unchecked_earlier=len(starts) - 1,
        )

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        self.emit("start", checkpoints=self.ckpt_dir, run_dir=self.run_dir)
        next_proc_scan = 0.0
        while not self.stopping:
            self.sample_checkpoints()
            self.sample_log()
            self.sample_journal()
            now = time.monotonic()
            if now >= next_proc_scan:
                self.sample_processes()
                self.sample_starts()
                next_proc_scan = now + 0.1
            time.sleep(self.interval_s)
        self.sample_checkpoints()
        self.sample_log()
        self.sample_journal()
        self.emit(
            "stats",
            samples=self.samples,
            proc_scans=self.proc_scans,
            max_committed=self.max_committed,
            min_verified_after_first_commit=self.min_verified,
            max_trainers=self.max_trainers,
            spawn_checks=self.spawn_checks,
            starts_seen=len(self.markers_seen),
            other_processes_seen=len(self.others_seen),
        )
        self.out.close()
        return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoints", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threshold", type=int, default=4)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    args = parser.parse_args()
    watcher = Watcher(args)

    def stop(*_: object) -> None:
        watcher.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return watcher.run()


if __name__ == "__main__":
    sys.exit(main())
