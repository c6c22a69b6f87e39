"""The process tree below a pid, from the kernel's children lists (psutil as the fallback)."""

from __future__ import annotations

import os

import psutil


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
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    listed = f.read().split()
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
