"""A torchrun worker that speaks the trainer contract (CPU, gloo): a real multi-process trainer.

Usage: python -m torch.distributed.run --standalone --nproc-per-node=2 tests/torchrun_worker.py
  --steps N [--save-every K] [--dt SECONDS] [--ignore-term]
Every step all-reduces a small tensor that also carries each rank's save/stop request,
so all ranks agree on the step at which to act. Each rank records the signals it received
itself in signals/rank<R>.log and its pid in workers/rank<R>.pid; rank 0 prints step lines
and writes andrea-bin checkpoints (every K steps, on SIGUSR1, on SIGTERM before exiting 0),
atomically. --ignore-term makes the workers ignore SIGTERM (to exercise SIGKILL).
"""

from __future__ import annotations

import argparse
import os
import signal
import struct
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainwarden.plugins.formats.andrea_bin import HEADER, checkpoint_name, read_header

N_PARAMS = 64


def save(directory: Path, step: int) -> None:
    directory.mkdir(exist_ok=True)
    final = directory / checkpoint_name(step)
    tmp = final.with_name(final.name + ".tmp")
    weights = struct.pack(f"<{N_PARAMS}f", *([float(step)] * N_PARAMS))
    with open(tmp, "wb") as f:
        f.write(HEADER.pack(step, N_PARAMS) + weights + bytes(8 * N_PARAMS))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, default=1000)
    parser.add_argument("--dt", type=float, default=0.05)
    parser.add_argument("--ignore-term", action="store_true")
    args = parser.parse_args()
    run_dir = Path.cwd()
    checkpoints = run_dir / "checkpoints"
    rank = int(os.environ["RANK"])
    for folder in ("signals", "workers"):
        (run_dir / folder).mkdir(exist_ok=True)
    (run_dir / "workers" / f"rank{rank}.pid").write_text(str(os.getpid()))
    signal_log = run_dir / "signals" / f"rank{rank}.log"
    # Counts only the handler writes: a request arriving while a step is in flight (in the
    # all_reduce, say) is seen at the next step instead of being wiped by the loop.
    received = {"save": 0, "stop": False}
    current = {"step": 0}

    def on_signal(signum: int, _frame: object) -> None:
        with open(signal_log, "a") as f:
            f.write(f"{signal.Signals(signum).name} at step {current['step']}\n")
        if signum == signal.SIGTERM:
            received["stop"] = True
        else:
            received["save"] += 1

    signal.signal(signal.SIGUSR1, on_signal)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_term else on_signal)
    dist.init_process_group("gloo")
    step = 0
    saves_handled = 0
    resume = os.environ.get("TRAINWARDEN_RESUME")
    if resume:
        step, _ = read_header(Path(resume))
    if rank == 0:
        print(f"torchrun worker: world {dist.get_world_size()}, from step {step}", flush=True)
    while step < args.steps:
        step += 1
        current["step"] = step
        time.sleep(args.dt)
        # One all_reduce carries the work and every rank's pending requests.
        saves_requested = received["save"]
        wanted = float(saves_requested > saves_handled)
        flags = torch.tensor([1.0, wanted, float(received["stop"])])
        dist.all_reduce(flags)
        save_now, stop_now = flags[1].item() > 0, flags[2].item() > 0
        # A save decided now comes after every request this rank has had so far, also one
        # that arrived during the all_reduce (the daemon signals the ranks one after the
        # other): that request is served by it, not by a second save at the next step.
        saves_handled = received["save"] if save_now else saves_requested
        if rank == 0:
            loss = 5.0 - 0.001 * step
            print(
                f"step: {step}, loss: {loss:.6f}, dt: {args.dt}, world: {flags[0].item():.0f}",
                flush=True,
            )
            if save_now or stop_now or step % args.save_every == 0 or step == args.steps:
                save(checkpoints, step)
        if stop_now:
            received["stop"] = False
            break
    dist.barrier()
    dist.destroy_process_group()
    # On the CPU with gloo, torch can still abort in the interpreter's finalization
    # (SIGABRT from a gloo thread's leftover work) after all of the above: end here.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
