"""A trainer that logs a bad loss (NaN, or a spike) when told to, then keeps going until
it is killed.

    python -S nan_trainer.py --events EVENTS --go GO [--dt 0.1] [--arm-after 5] [--bad-loss nan]

One `step: N, loss: X, dt: D` line per --dt seconds on stdout, flushed, the loss about 5.
Records (with time.monotonic()) in EVENTS: `start PID T`, then `armed PID T` once
--arm-after steps are logged, and `bad PID T STEP` just before each line with the bad loss
is written (`nan PID T STEP` too, before the first). It turns bad at the first step
boundary where the file GO holds its own pid and stays bad, as a poisoned model would:
`--bad-loss nan` (the default) for a divergence, `--bad-loss 15` for a loss spike (three
times the trend). Standard library only.
"""

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", required=True)
    parser.add_argument("--go", required=True)
    parser.add_argument("--dt", type=float, default=0.1)
    parser.add_argument("--arm-after", type=int, default=5)
    parser.add_argument("--lifetime", type=float, default=300.0)
    parser.add_argument("--bad-loss", default="nan")
    args = parser.parse_args()
    pid = os.getpid()
    events = os.open(args.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    started = time.monotonic()
    os.write(events, f"start {pid} {started!r}\n".encode())
    poisoned = False
    step = 0
    deadline = started
    while time.monotonic() - started < args.lifetime:
        deadline += args.dt
        time.sleep(max(0.0, deadline - time.monotonic()))
        step += 1
        if not poisoned and step > args.arm_after:
            try:
                with open(args.go) as f:
                    poisoned = f.read().strip() == str(pid)
            except OSError:
                pass
            if poisoned:
                os.write(events, f"nan {pid} {time.monotonic()!r} {step}\n".encode())
        if poisoned:
            # The time is taken just before the write, not after: the reader woken by the
            # write can get the CPU (and kill us) before this process runs again.
            os.write(events, f"bad {pid} {time.monotonic()!r} {step}\n".encode())
            print(f"step: {step}, loss: {args.bad_loss}, dt: {args.dt}", flush=True)
            continue
        print(f"step: {step}, loss: {5.0 - 0.001 * step:.6f}, dt: {args.dt}", flush=True)
        if step == args.arm_after:
            os.write(events, f"armed {pid} {time.monotonic()!r}\n".encode())


if __name__ == "__main__":
    main()
