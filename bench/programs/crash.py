"""A trainer that crashes LIFE_S after its start: records when it started and when it died,
then exits 1.

    python -S crash.py EVENTS [GATE]

It prints one step line. EVENTS gets `start PID T` as the first thing the interpreter runs and `exit PID T WALL`
just before os._exit; T is time.monotonic(), one clock for every process on a Linux
machine, and WALL is time.time(), to compare with the daemon's journal.
While the file GATE exists the child waits between the two (so the benchmark can let one
supervisor at a time crash-loop); the wait is not part of any measured gap.
It lives LIFE_S (0.4 s) first: a trainer that dies as it starts is a crash loop, which a
supervisor paces with its backoff, and trainwarden prepares the next start's process once a
start has run 0.2 s (shell.spare). Standard library only, so it runs under `python -S` from any supervisor's environment.
"""

import os
import sys
import time

LIFE_S = 0.4

started = time.monotonic()
events = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(events, f"start {os.getpid()} {started!r}\n".encode())
# A step line: a start that logs one is journaled whole (a crash loop of starts that log
# no step is folded into `repeated` records, leaving the journal-derived figure a handful
# of samples).
print("step: 1, loss: 2.0, dt: 0.01", flush=True)
time.sleep(LIFE_S)
while len(sys.argv) > 2 and os.path.exists(sys.argv[2]):
    time.sleep(0.02)
os.write(events, f"exit {os.getpid()} {time.monotonic()!r} {time.time()!r}\n".encode())
os._exit(1)
