"""A trainer that double-forks a long-lived helper, as a data loader or a stuck CUDA child
would be: a real process tree for the containment tests.

Usage: python tests/forking_trainer.py [--crash-at STEP] [--stubborn-helper] [--dt SECONDS]
  [--helper-lifetime SECONDS]
It forks a child that calls setsid and forks the helper, then exits at once, so the helper
has lost its parent and sits in a session of its own. The helper writes its pid to
helpers/seg<SEG>.pid (TRAINWARDEN_SEG) and its parent's pid to helpers/seg<SEG>.ppid
once it has lost its own, then sleeps forever or --helper-lifetime seconds (ignoring
SIGTERM with --stubborn-helper). The trainer prints step lines, exits 0 on SIGTERM and 1 at --crash-at.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path


def start_helper(pid_file: Path, stubborn: bool, lifetime: float | None) -> None:
    child = os.fork()
    if child:
        os.waitpid(child, 0)  # the middle process exits at once: the helper is an orphan
        return
    os.setsid()
    middle = os.getpid()
    if os.fork():
        os._exit(0)
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write(pid_file, os.getpid())
    while os.getppid() == middle:
        time.sleep(0.01)
    write(pid_file.with_suffix(".ppid"), os.getppid())
    if lifetime is not None:
        time.sleep(lifetime)
        os._exit(0)
    while True:
        time.sleep(3600)


def write(path: Path, number: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(number))
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--stubborn-helper", action="store_true")
    parser.add_argument("--dt", type=float, default=0.05)
    parser.add_argument("--helper-lifetime", type=float, default=None)
    args = parser.parse_args()
    helpers = Path.cwd() / "helpers"
    helpers.mkdir(exist_ok=True)
    seg = os.environ.get("TRAINWARDEN_SEG", "0")
    start_helper(helpers / f"seg{seg}.pid", args.stubborn_helper, args.helper_lifetime)
    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    step = 0
    while not stop["asked"]:
        step += 1
        print(f"step: {step}, loss: {5.0 - 0.001 * step:.6f}, dt: {args.dt}", flush=True)
        if step == args.crash_at:
            return 1
        time.sleep(args.dt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
