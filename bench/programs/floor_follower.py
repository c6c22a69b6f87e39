"""The least a Python program can do to follow a log line by line: the cost floor.

    python -S floor_follower.py LOG [SEEN]

An asyncio loop with one inotify watch (IN_MODIFY) on LOG, bound by trainwarden/libc.py
as the daemon binds it; each wake-up reads the new bytes and counts the newlines,
nothing else: no parsing, no writes, no other timers. Its CPU per line at a given rate is
what one event-driven wake-up per line costs on this machine, the floor under any
follower that reacts to every line as it arrives. With SEEN, each read's time and the
log's length after it are kept in memory and written to SEEN as `OFFSET TIME` lines when
the follower is stopped (SIGTERM), for the bench's write -> seen latency. Standard
library only.
"""

import asyncio
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from trainwarden import libc  # noqa: E402  (after the checkout is on the path, under -S)

IN_MODIFY = 0x00000002


def write_seen(path: str, seen: list[tuple[int, float]]) -> None:
    with open(path, "w") as out:
        out.writelines(f"{offset} {t!r}\n" for offset, t in seen)


async def follow(path: str, seen_path: str | None) -> None:
    inotify = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    libc.inotify_add_watch(inotify, path, IN_MODIFY)
    log = os.open(path, os.O_RDONLY)
    position = os.fstat(log).st_size
    lines = 0
    seen: list[tuple[int, float]] = []

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
            seen.append((position, time.time()))

    loop = asyncio.get_running_loop()
    loop.add_reader(inotify, readable)
    done = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, done.set_result, None)
    await done
    if seen_path is not None:
        write_seen(seen_path, seen)


if __name__ == "__main__":
    asyncio.run(follow(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
