"""A trainer that logs step lines at a fixed rate and does nothing else.

    python -S rate_trainer.py --rate-file PATH --events EVENTS [--lifetime S] [--stamps FILE]

PATH holds the rate in lines/s; it is read again every 0.1 s, so one trainer (and one
supervisor) can be measured at several rates. Writes `start PID T` to EVENTS, then
one flushed `step: N, loss: X, dt: D` line every 1/rate s (when it falls behind it
catches up in a burst, so the count stays rate x time). With --stamps, each line's
write time (time.time() just before the write) goes to FILE as `STEP TIME`, for a
supervisor's line-to-event latency. Standard library only.
"""

import argparse
import os
import sys
import time


def read_rate(path: str, current: float) -> float:
    try:
        with open(path) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return current


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate-file", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--lifetime", type=float, default=900.0)
    parser.add_argument("--stamps", default=None)
    args = parser.parse_args()
    stamps = (
        os.open(args.stamps, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if args.stamps else None
    )
    events = os.open(args.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    started = time.monotonic()
    os.write(events, f"start {os.getpid()} {started!r}\n".encode())
    out = sys.stdout
    rate = read_rate(args.rate_file, 10.0)
    base_t, base_step, step = started, 0, 0
    checked = started
    while True:
        now = time.monotonic()
        if now - started > args.lifetime:
            return
        if now - checked >= 0.1:
            checked = now
            new_rate = read_rate(args.rate_file, rate)
            if new_rate != rate:
                rate, base_t, base_step = new_rate, now, step
        due = base_step + int((now - base_t) * rate)
        while step < due:
            step += 1
            written = time.time()
            out.write(f"step: {step}, loss: {5.0 - 1e-6 * step:.6f}, dt: {1 / rate:.4f}\n")
            out.flush()  # a trainer flushes each line so `tail -f` shows it at once
            if stamps is not None:
                os.write(stamps, f"{step} {written!r}\n".encode())
        next_line = base_t + (step + 1 - base_step) / rate
        time.sleep(min(0.1, max(0.0, next_line - time.monotonic())))


if __name__ == "__main__":
    main()
