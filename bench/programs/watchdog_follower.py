"""The floor of following a log through watchdog: its observer, handed to an asyncio loop.

    python watchdog_follower.py LOG [SEEN]      (no -S: watchdog is a site package)

watchdog's inotify observer watches LOG's folder for writes to LOG (`event_filter`
FileModifiedEvent, as a follower that must also see the log replaced watches the folder);
its handler hands each event to an asyncio loop (`call_soon_threadsafe`), which reads the
new bytes and counts the newlines, nothing else. Beside floor_follower.py (the same loop
woken by its own inotify descriptor), the difference is what watchdog's threads cost per
line: its reader, its dispatcher, the watch's emitter and the observer each take the
event in turn before the loop does. SEEN is floor_follower.py's: each read's time and the
log's length after it, written when the follower is stopped.
"""

import asyncio
import os
import signal
import sys
import time

from watchdog.events import FileModifiedEvent, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer


def write_seen(path: str, seen: list[tuple[int, float]]) -> None:
    with open(path, "w") as out:
        out.writelines(f"{offset} {t!r}\n" for offset, t in seen)


async def follow(path: str, seen_path: str | None) -> None:
    path = os.path.abspath(path)
    log = os.open(path, os.O_RDONLY)
    position = os.fstat(log).st_size
    lines = 0
    seen: list[tuple[int, float]] = []
    loop = asyncio.get_running_loop()

    def readable() -> None:
        nonlocal position, lines
        while data := os.pread(log, 1 << 20, position):
            position += len(data)
            lines += data.count(b"\n")
            seen.append((position, time.time()))

    class HandOff(FileSystemEventHandler):
        def dispatch(self, event: FileSystemEvent) -> None:
            if event.src_path == path:
                loop.call_soon_threadsafe(readable)

    observer = Observer()
    observer.schedule(HandOff(), os.path.dirname(path), event_filter=[FileModifiedEvent])
    observer.start()
    done = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, done.set_result, None)
    try:
        await done
    finally:
        observer.stop()
        observer.join()
    if seen_path is not None:
        write_seen(seen_path, seen)


if __name__ == "__main__":
    asyncio.run(follow(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
