"""The process tree below a pid, from the kernel's children lists (psutil as the fallback)."""

from __future__ import annotations

import os

import psutil

READ_BYTES = 16 << 10
"""Bytes asked of each read of a /proc file (a larger file takes more reads)."""


def read_proc(path: str) -> bytes:
    """A /proc file's whole content, read with bare descriptor calls: an open, the reads and
    a close, where a Python file object adds five more (two fstats, an isatty ioctl, two
    seeks), for files the reaper reads every second. Raises OSError as open() would."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, READ_BYTES):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _kernel_descendants(pid: int) -> list[int] | None:
    """The tree below `pid` from the kernel's per-thread `children` lists: a few small
    reads. None when the kernel does not provide them (CONFIG_PROC_CHILDREN off)."""
    found: list[int] = []
    seen = {pid}
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue  # exited while we walked
        for tid in tasks:
            try:
                listed = read_proc(f"/proc/{parent}/task/{tid}/children").split()
            except FileNotFoundError:
                if os.path.isdir(f"/proc/{parent}/task/{tid}"):
                    return None  # the thread is there, its list is not: the kernel lacks them
                continue  # that thread (or its whole process) ended while we walked
            for child in map(int, listed):
                if child not in seen:
                    seen.add(child)
                    found.append(child)
                    pending.append(child)
    return found


def descendants(pid: int) -> list[int]:
    """Pids of every process below `pid` ([] when it is gone).

    From the kernel's children lists where it has them; otherwise psutil, which reads the
    stat file of every process on the machine to find the same tree.
    """
    found = _kernel_descendants(pid)
    if found is not None:
        return found
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


START_ENV = "TRAINWARDEN_START"
"""The variable that marks every process of one trainer start: `<seg>-<random>`."""


def _environ(pid: int) -> bytes:
    try:
        return read_proc(f"/proc/{pid}/environ")
    except OSError:
        return b""  # gone, a zombie (its environ reads empty) or not ours to read


def start_marker_of(pid: int) -> str | None:
    """The start marker in a process's environment (None: not a trainer start's)."""
    prefix = f"{START_ENV}=".encode()
    for entry in _environ(pid).split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def run_dir_of(pid: int) -> str | None:
    prefix = b"TRAINWARDEN_RUN_DIR="
    for entry in _environ(pid).split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def marked_processes(run_dir: str) -> list[int]:
    """Every process on the machine that some start of the run in `run_dir` began: it carries
    a start marker and names the run. A full /proc scan, for a daemon's start-up (the old
    daemon's trainer and its orphans are nobody's children now)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == os.getpid():
            continue
        if start_marker_of(pid) is not None and run_dir_of(pid) == run_dir:
            found.append(pid)
    return found


def zombie_children(pid: int) -> list[tuple[int, int]]:
    """(pid, session id) of each direct child of `pid` that has exited and is not yet reaped."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    for tid in tasks:
        try:
            listed = read_proc(f"/proc/{pid}/task/{tid}/children").split()
        except OSError:
            continue
        for child in map(int, listed):
            stat = _stat_fields(child)
            if stat is not None and stat[0] == "Z":
                found.append((child, int(stat[3])))
    return found


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name: state, ppid, pgrp, session, ..."""
    try:
        raw = read_proc(f"/proc/{pid}/stat")
    except OSError:
        return None
    return raw.rsplit(b") ", 1)[-1].decode().split()


def is_exited(pid: int) -> bool:
    """Gone, or a zombie waiting for its parent."""
    stat = _stat_fields(pid)
    return stat is None or stat[0] in ("Z", "X")


def session_of(pid: int) -> int | None:
    stat = _stat_fields(pid)
    return int(stat[3]) if stat is not None else None
