"""A cgroup v2 of its own for each trainer start, where the daemon may make one.

Under systemd with `Delegate=yes`, or for a daemon that can write below its own cgroup v2
(root, or a delegated subtree), each start gets `trainwarden-<run>-<marker>/` below the
daemon's cgroup (`<run>`: a hash of the run directory, as daemons of several runs may share
a cgroup). The forked child writes itself into it before it executes the trainer (see
process.spawn), so everything the trainer forks, even in its first instruction, is inside: `cgroup.procs` lists the start's processes whatever they do to their
environment or session, and `cgroup.kill` ends them all at once. Elsewhere (no cgroup v2,
no write access) the marker and the subreaper are the only means (see containment).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

import xxhash

PREFIX = "trainwarden-"
EMPTY_WAIT_S = 5.0


def own_cgroup() -> tuple[Path | None, str]:
    """(the directory of this process's cgroup v2, "") or (None, why there is none)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        return None, f"cannot read /proc/self/cgroup: {exc.strerror}"
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None, "this process is in no cgroup v2"
    mount = _cgroup2_mount()
    if mount is None:
        return None, "no cgroup2 file system is mounted"
    return mount / path.lstrip("/"), ""


def _cgroup2_mount() -> Path | None:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if " - " not in line:
            continue
        after = line.split(" - ", 1)[1].split()
        if after and after[0] == "cgroup2" and fields[3] == "/":
            return Path(fields[4])
    return None


class StartCgroups:
    """The cgroups of this run's starts, below `base` (the daemon's own cgroup)."""

    def __init__(self, base: Path, run_dir: Path) -> None:
        self.base = base
        # Daemons of other runs may share this cgroup: each run's starts have names of its own.
        self.prefix = f"{PREFIX}{xxhash.xxh64_hexdigest(os.fsencode(run_dir))[:12]}-"

    @classmethod
    def find(cls, run_dir: Path) -> tuple[StartCgroups | None, str]:
        """The daemon's cgroups for `run_dir` if it may make them; else (None, why not)."""
        base, why = own_cgroup()
        if base is None:
            return None, why
        probe = base / f"{PREFIX}probe-{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return None, f"cannot make a cgroup below {base}: {exc.strerror}"
        if not (base / "cgroup.kill").exists() and not (base / "cgroup.procs").exists():
            return None, f"{base} is not a cgroup v2 folder"
        return cls(base, run_dir), ""

    def path(self, marker: str) -> Path:
        return self.base / f"{self.prefix}{marker}"

    def open_for_child(self, marker: str) -> tuple[int | None, str | None]:
        """(a descriptor of the start's cgroup.procs, made now, for the child to write
        itself into before it runs the trainer; why not). Close it after the spawn."""
        folder = self.path(marker)
        try:
            folder.mkdir(exist_ok=True)
            return os.open(folder / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC), None
        except OSError as exc:
            with contextlib.suppress(OSError):
                folder.rmdir()
            return None, f"cannot open {folder / 'cgroup.procs'}: {exc.strerror}"

    def join(self, marker: str, pid: int) -> str | None:
        """Put `pid` in its start's cgroup (made now); why not, if it could not be."""
        folder = self.path(marker)
        try:
            folder.mkdir(exist_ok=True)
            (folder / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as exc:
            with contextlib.suppress(OSError):
                folder.rmdir()
            return f"cannot move pid {pid} into {folder}: {exc.strerror}"
        return None

    def procs(self, marker: str) -> list[int]:
        """The live processes of a start's cgroup ([] when it has none)."""
        return _read_procs(self.path(marker))

    def markers(self) -> list[str]:
        """This run's starts whose cgroups are here (a previous daemon's, after a restart)."""
        try:
            return sorted(
                entry.name[len(self.prefix) :]
                for entry in os.scandir(self.base)
                if entry.name.startswith(self.prefix) and entry.is_dir(follow_symlinks=False)
            )
        except OSError:
            return []

    def end(self, marker: str) -> list[int]:
        """Kill whatever is still in a start's cgroup and remove it; the pids killed."""
        folder = self.path(marker)
        left = _read_procs(folder)
        if left:
            kill = folder / "cgroup.kill"
            if kill.exists():
                with contextlib.suppress(OSError):
                    kill.write_text("1\n")
            else:
                for pid in left:
                    with contextlib.suppress(OSError):
                        os.kill(pid, 9)
        deadline = time.monotonic() + EMPTY_WAIT_S
        while True:
            try:
                folder.rmdir()
                return left
            except FileNotFoundError:
                return left
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                    return left
            time.sleep(0.02)


def _read_procs(folder: Path) -> list[int]:
    try:
        text = (folder / "cgroup.procs").read_text()
    except OSError:
        return []
    return sorted(int(pid) for pid in text.split())
