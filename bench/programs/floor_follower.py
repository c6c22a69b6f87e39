"""The least a Python program can do to follow a log line by line: the cost floor.

    python -S floor_follower.py LOG

An asyncio loop with one inotify watch (IN_MODIFY) on LOG; each wake-up reads the new
bytes and counts the newlines, nothing else: no parsing, no writes, no other timers.
Its CPU per line at a given rate is what one event-driven wake-up per line costs on
this machine, the floor under any follower that reacts to every line as it arrives.
Standard library only.
"""

import asyncio
import ctypes
import os
import signal
import sys

IN_MODIFY = 0x00000002


async def follow(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    inotify = libc.inotify_init()
    if inotify < 0 or libc.inotify_add_watch(inotify, os.fsencode(path), IN_MODIFY) < 0:
        raise OSError(ctypes.get_errno(), f"inotify on {path}")
    os.set_blocking(inotify, False)
    log = os.open(path, os.O_RDONLY)
    position = os.fstat(log).st_size
    lines = 0

    def readable() -> None:
        nonlocal position, lines
        try:
            while os.read(inotify, 65536):
                pass
        except BlockingIOError:
            pass
        while data := os.pread(log, 1 << 20, position):
            position += len(data)
            lines += data.count(b"\n")

    loop = asyncio.get_running_loop()
    loop.add_reader(inotify, readable)
    done = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, done.set_result, None)
    await done


if __name__ == "__main__":
    asyncio.run(follow(sys.argv[1]))
