"""The log follower people write by hand: readline, sleep a second when nothing is new,
kill the trainer on the first 'nan'.

    python follower.py LOG TRAINER_PID EVENTS

Writes `ready PID T` to EVENTS once it is at the end of the log, `killed PID T` after
the kill.
"""

import os
import signal
import sys
import time

log_path, trainer_pid, events_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
events = os.open(events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
with open(log_path) as log:
    log.seek(0, os.SEEK_END)
    os.write(events, f"ready {os.getpid()} {time.monotonic()!r}\n".encode())
    while True:
        line = log.readline()
        if not line:
            time.sleep(1.0)
            continue
        if "nan" in line:
            os.kill(trainer_pid, signal.SIGKILL)
            os.write(events, f"killed {os.getpid()} {time.monotonic()!r}\n".encode())
            break
