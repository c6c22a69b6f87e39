"""A trainer whose loss spikes when told to, and stays up until it is killed.

    python -S spike_trainer.py --events EVENTS --go GO [--dt 0.1] [--arm-after 30]

One `step: N, loss: X, dt: D` line per --dt seconds on stdout, flushed, the loss about 5.
Records (with time.monotonic()) in EVENTS: `start PID T`, then `armed PID T` once
--arm-after steps are logged, and `high PID T STEP` just before each line with the spiked
loss (15, three times the trend) is written. It spikes from the first step boundary where
the file GO holds its own pid. Standard library only.
"""

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", required=True)
    parser.add_argument("--go", required=True)
    parser.add_argument("--dt", type=float, default=0.1)
    parser.add_argument("--arm-after", type=int, default=30)
    parser.add_argument("--lifetime", type=float, default=300.0)
    args = parser.parse_args()
    pid = os.getpid()
    events = os.open(args.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    started = time.monotonic()
    os.write(events, f"start {pid} {started!r}\n".encode())
    spiking = False
    step = 0
    deadline = started
    while time.monotonic() - started < args.lifetime:
        deadline += args.dt
        time.sleep(max(0.0, deadline - time.monotonic()))
        step += 1
        if not spiking and step > args.arm_after:
            try:
                with open(args.go) as f:
                    spiking = f.read().strip() == str(pid)
            except OSError:
                pass
        if spiking:
            # The time is taken just before the write: the reader it wakes may kill us first.
            os.write(events, f"high {pid} {time.monotonic()!r} {step}\n".encode())
            print(f"step: {step}, loss: 15.000000, dt: {args.dt}", flush=True)
            continue
        print(f"step: {step}, loss: {5.0 - 0.001 * step:.6f}, dt: {args.dt}", flush=True)
        if step == args.arm_after:
            os.write(events, f"armed {pid} {time.monotonic()!r}\n".encode())


if __name__ == "__main__":
    main()
