"""The chaos soak's hostile trainer: the reference trainer behind a wrapper that leaves a
long-lived helper behind, and optionally stays the main process without a SIGUSR1 handler.

    python tests/chaos/forking_wrapper.py [--stubborn-every N] [--stay] [--no-helper]
        [--python-module MODULE] -- CMD...

First it double-forks a helper, as a data loader or a stuck CUDA child would be: a middle
process calls setsid and forks the helper, then exits, so the helper has lost its parent
and sits in a session of its own. The helper inherits the environment (the start's
TRAINWARDEN_START marker and TRAINWARDEN_RUN_DIR), sleeps forever and, when the start's
segment (TRAINWARDEN_SEG) is a multiple of --stubborn-every, ignores SIGTERM so that only
SIGKILL ends it.

Then, by default, it execs CMD in its own process: the trainer is unchanged (same pid,
same argv as without the wrapper), so the run stays bit-identical to an unwrapped one.
With --stay it runs CMD as its child instead and remains the main process: it ignores
SIGUSR1 (a trainer without a save handler, as the daemon sees it with
`signal_target = "main"`), forwards SIGTERM and SIGINT to the child, and exits as the child
did. It imports nothing heavy, so the helper is a small process.

With --python-module, CMD is only the arguments and the command is `python -m MODULE CMD...`
(this interpreter): the wrapper's own command line then does not read as the module's, so
a test that recognises the reference trainer by `-m trainwarden.trainer` in a command line
never takes the wrapper (or its forks before they exec) for a second trainer.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

HELPER = """
import signal, sys, time
if sys.argv[1:] == ["stubborn"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(3600)
"""
"""The helper's program: it sleeps forever, ignoring SIGTERM when told to be stubborn."""


def start_helper(stubborn: bool) -> None:
    middle = os.fork()
    if middle:
        os.waitpid(middle, 0)  # the middle process exits at once: the helper is an orphan
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        # A command line of its own (the wrapper's names the trainer's module, and the
        # helper must not read as a second trainer); the environment goes with the exec.
        os.execv(sys.executable, [sys.executable, "-c", HELPER, "stubborn" if stubborn else ""])
    finally:
        os._exit(127)


def stay(argv: list[str]) -> int:
    """Run argv as a child; this process ignores SIGUSR1 and passes SIGTERM/SIGINT on."""
    child = {"pid": 0}

    def forward(signum: int, _frame: object) -> None:
        if child["pid"]:
            try:
                os.kill(child["pid"], signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    child["pid"] = pid
    # After the fork: the child must not inherit SIG_IGN (the trainer installs its own
    # handler anyway, but a child that did not would silently ignore saves).
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.WEXITSTATUS(status)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stubborn-every", type=int, default=0)
    parser.add_argument("--stay", action="store_true")
    parser.add_argument("--no-helper", action="store_true")
    parser.add_argument("--python-module", default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.python_module is not None:
        command = [sys.executable, "-m", args.python_module, *command]
    if not command:
        parser.error("no trainer command after --")
    seg = int(os.environ.get("TRAINWARDEN_SEG", "0") or 0)
    if not args.no_helper:
        start_helper(args.stubborn_every > 0 and seg % args.stubborn_every == 0)
    if args.stay:
        return stay(command)
    sys.stdout.flush()
    os.execv(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
