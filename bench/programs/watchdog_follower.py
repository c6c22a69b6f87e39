"""The floor of following a log through watchdog: its observer, handed to an asyncio loop.

    python watchdog_follower.py LOG      (no -S: watchdog is a site package)

watchdog's inotify observer watches LOG's folder for writes to LOG (`event_filter`
FileModifiedEvent, as a follower that must also see the log replaced watches the folder);
its handler hands each event to an asyncio loop (`call_soon_threadsafe`), which reads the
new bytes and counts the newlines, nothing else. Beside floor_follower.py (the same loop
woken by its own inotify descriptor), the difference is what watchdog's threads cost per
line: its reader, its dispatcher, the watch's emitter and the observer each take the
event in turn before the loop does.
"""

import asyncio
import os
import signal
import sys

from watchdog.events import FileModifiedEvent, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer


async def follow(path: str) -> None:
    path = os.path.abspath(path)
    log = os.open(path, os.O_RDONLY)
    position = os.fstat(log).st_size
    lines = 0
    loop = asyncio.get_running_loop()

    def readable() -> None:
        nonlocal position, lines
        while data := os.pread(log, 1 << 20, position):
            position += len(data)
            lines += data.count(b"\n")

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


if __name__ == "__main__":
    asyncio.run(follow(sys.argv[1]))
