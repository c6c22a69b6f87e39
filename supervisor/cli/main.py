"""`trainwarden`: the command line. Each command takes the run directory (default: cwd).

Errors are one line on stderr; exit status 2 for bad usage or config, 1 for a failed
operation (no daemon, a refused command). The parser is `parser`; the commands are in
`commands`, the text they print in `output`.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys

from trainwarden.supervisor.cli.parser import build_parser
from trainwarden.supervisor.errors import (
    CommandRefused,
    DaemonNotRunning,
    TrainwardenError,
)

VALUE_OPTIONS = ("--socket", "--daemon-user")
"""Options of pin and unpin whose value is the next word (not a positional)."""


def _reorder_step(argv: list[str]) -> list[str]:
    """Allow `pin STEP [RUN_DIR]` as well as `pin RUN_DIR STEP`."""
    if len(argv) < 2 or argv[0] not in ("pin", "unpin"):
        return argv
    positional: list[str] = []
    rest: list[str] = []
    words = iter(argv[1:])
    for word in words:
        if word in VALUE_OPTIONS:
            rest += [word, next(words, "")]
        elif word.startswith("-"):
            rest.append(word)
        else:
            positional.append(word)
    if len(positional) == 2 and positional[0].isdigit() and not positional[1].isdigit():
        return [argv[0], positional[1], positional[0], *rest]
    if len(positional) == 1 and positional[0].isdigit():
        return [argv[0], ".", positional[0], *rest]
    return argv


def stdout_closed() -> bool:
    """Whether the reader of our stdout is gone (a pipe whose other end was closed)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(mask & (select.POLLERR | select.POLLHUP) for _fd, mask in poller.poll(0))
    except (OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    argv = _reorder_step(list(sys.argv[1:] if argv is None else argv))
    try:
        args = build_parser().parse_args(argv)
        code = int(args.func(args))
        sys.stdout.flush()  # here, where a closed pipe can still be told apart
        return code
    except CommandRefused as exc:
        print(f"trainwarden: refused ({exc.code}): {exc}", file=sys.stderr)
        return 1
    except DaemonNotRunning as exc:
        print(f"trainwarden: {exc}", file=sys.stderr)
        return 1
    except TrainwardenError as exc:
        print(f"trainwarden: {exc}", file=sys.stderr)
        return exc.exit_code
    except ConnectionError as exc:  # the daemon hung up mid-exchange (a refusal, an exit)
        if isinstance(exc, BrokenPipeError) and stdout_closed():
            # `trainwarden status | head -1`: whoever read our output has all it wanted.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        print(
            f"trainwarden: the daemon closed the connection ({exc.strerror or exc})",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
