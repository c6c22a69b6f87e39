"""The operator's commands as typed values, parsed and checked once, where they arrive.

`parse_command(cmd, args)` turns a request off the control socket into one of the
dataclasses below, or a `BadRequest` that says what is wrong (the reply's error code
and message). What a command needs from the run's files (a pivot's arms and policies)
arrives separately, as a `PivotContext` the shell reads before the policy decides;
likewise which signals the trainer catches (the Operator event's `handles`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainwarden.supervisor.core.kinds import ErrorCode

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import OperatorArgs

MAX_STEP = 2**31 - 1
"""The largest step any checkpoint or request may name (the trainer contract's MAX_STEP,
repeated here because the core imports nothing outside itself; a test keeps them equal)."""


@dataclass(frozen=True)
class Save:
    """Ask the trainer for a checkpoint (SIGUSR1); with `wait`, answer once it commits."""

    wait: bool = False
    timeout_s: float | None = None
    """How long a waiting save may take (None: the rules' save_wait_timeout_s, also its
    upper bound)."""


@dataclass(frozen=True)
class Stop:
    """Stop the trainer (SIGTERM) and keep it stopped."""

    force: bool = False
    """Stop a trainer that does not catch SIGTERM anyway, losing its steps since the
    newest checkpoint."""


@dataclass(frozen=True)
class Start:
    """Start a halted run again from its newest verified checkpoint."""

    from_scratch: bool = False
    """Start over at step 0: only for a run with no verified checkpoint left."""


@dataclass(frozen=True)
class Pin:
    """Keep the checkpoint at `step` whatever retention says."""

    step: int


@dataclass(frozen=True)
class Unpin:
    """Hand the checkpoint at `step` back to retention."""

    step: int
    dry_run: bool = False
    """Change nothing; answer which checkpoints retention would delete at once if it were
    unpinned (what an operator is asked to confirm)."""


@dataclass(frozen=True)
class Shutdown:
    """Stop the trainer, then the daemon."""

    force: bool = False
    """As Stop's: kill a trainer that does not catch SIGTERM, losing its unsaved steps."""


@dataclass(frozen=True)
class Pivot:
    """New caps and floors for the data-mixing bandit (see core.pivot)."""

    caps: dict[str, float] = field(default_factory=dict)
    floors: dict[str, float] = field(default_factory=dict)


Command = Save | Stop | Start | Pin | Unpin | Shutdown | Pivot

NAMES: dict[type, str] = {
    Save: "save",
    Stop: "stop",
    Start: "start",
    Pin: "pin",
    Unpin: "unpin",
    Shutdown: "shutdown",
    Pivot: "pivot",
}
ACTING = tuple(NAMES.values())
"""The commands that change the run (one at a time), as the wire names them."""


def command_name(command: Command) -> str:
    return NAMES[type(command)]


JOURNALED_TEXT_MAX = 200
"""Characters of one operator-given name (an arm) the journal keeps; the rest is marked."""
JOURNALED_ITEMS_MAX = 64
"""Entries of one operator-given table (caps, floors) the journal keeps."""


def _journaled_name(name: str) -> str:
    if len(name) <= JOURNALED_TEXT_MAX:
        return name
    return f"{name[:JOURNALED_TEXT_MAX]}...[truncated: {len(name)} characters]"


def _journaled_table(table: dict[str, float]) -> dict[str, float | str]:
    """A table of the request as the journal keeps it: bounded however large it came, so
    that junk sent to the socket cannot grow the journal by its own size."""
    kept: dict[str, float | str] = {}
    for index, (name, value) in enumerate(table.items()):
        if index == JOURNALED_ITEMS_MAX:
            kept["...[truncated]"] = f"{len(table) - JOURNALED_ITEMS_MAX} more entries"
            break
        kept[_journaled_name(name)] = value
    return kept


def command_args(command: Command) -> OperatorArgs:
    """The command's arguments as the journal's `operator` record names them."""
    if isinstance(command, Save):
        args: OperatorArgs = {"wait": command.wait}
        if command.timeout_s is not None:
            args["timeout_s"] = command.timeout_s
        return args
    if isinstance(command, Stop | Shutdown):
        return {"force": True} if command.force else {}
    if isinstance(command, Pin | Unpin):
        return {"step": command.step}
    if isinstance(command, Pivot):
        return {"caps": _journaled_table(command.caps), "floors": _journaled_table(command.floors)}
    if isinstance(command, Start):
        return {"from_scratch": True} if command.from_scratch else {}
    return {}


@dataclass(frozen=True)
class PivotContext:
    """What a pivot is checked against, read from the run's files when it is asked for."""

    arms: tuple[str, ...]
    """The arms in the trainer's bandit state (empty: it has written none yet)."""
    zombies: tuple[str, ...]
    """Arms in the bandit state whose data source is gone."""
    current_policy: dict[str, Any]
    """The policy in force, every known arm spelled out."""
    new_policy: dict[str, Any] | None
    """The current policy with the command's caps and floors; None if it breaks a rule."""
    problems: tuple[str, ...]
    """The rules the new policy breaks, one message each."""
    utc: str
    """When it was asked for (YYYYmmddTHHMMSSZ), for the archive folder's name."""
    state_file: str = "ok"
    """What the bandit state (.state.json) said: "ok" (it names arms), "no_arms" (it names
    none), "unreadable" (not a JSON object: being rewritten, or torn), "missing" (no file)."""


@dataclass(frozen=True)
class BadRequest:
    """A request that names no command, or a command with unusable arguments."""

    code: ErrorCode
    message: str


def parse_command(cmd: str, args: dict[str, Any]) -> Command | BadRequest:
    """The typed command for a request (`args`: its fields other than id and cmd)."""
    if cmd == "save":
        return _save(args)
    if cmd in ("stop", "shutdown"):
        force = args.get("force", False)
        if not isinstance(force, bool):
            return BadRequest("bad_argument", "'force' must be true or false")
        return Stop(force) if cmd == "stop" else Shutdown(force)
    if cmd == "start":
        from_scratch = args.get("from_scratch", False)
        if not isinstance(from_scratch, bool):
            return BadRequest("bad_argument", "'from_scratch' must be true or false")
        return Start(from_scratch)
    if cmd in ("pin", "unpin"):
        step = args.get("step")
        if step is not None and not (_is_int(step, low=0) and step <= MAX_STEP):
            return BadRequest(
                "bad_argument", f"'step' must be an integer between 0 and {MAX_STEP}, got {step!r}"
            )
        if step is None:
            return BadRequest("bad_argument", f"'{cmd}' needs 'step', the checkpoint's step number")
        if cmd == "pin":
            return Pin(step)
        dry_run = args.get("dry_run", False)
        if not isinstance(dry_run, bool):
            return BadRequest("bad_argument", "'dry_run' must be true or false")
        return Unpin(step, dry_run=dry_run)
    if cmd == "pivot":
        return _pivot(args)
    return BadRequest("unknown_command", f"unknown command '{cmd}'")


def _is_int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _save(args: dict[str, Any]) -> Save | BadRequest:
    wait = args.get("wait", False)
    if not isinstance(wait, bool):
        return BadRequest("bad_argument", "'wait' must be true or false")
    timeout = args.get("timeout_s")
    if timeout is not None and (not _is_number(timeout) or timeout <= 0):
        return BadRequest("bad_argument", f"'timeout_s' must be a positive number, got {timeout!r}")
    return Save(wait=wait, timeout_s=None if timeout is None else float(timeout))


def _pivot(args: dict[str, Any]) -> Pivot | BadRequest:
    tables = {}
    for key in ("caps", "floors"):
        table = args.get(key, {})
        if not isinstance(table, dict) or not all(_is_number(v) for v in table.values()):
            return BadRequest(
                "bad_argument", f"'{key}' must map arm names to numbers, e.g. {{\"docs\": 0.5}}"
            )
        tables[key] = table
    if not args.get("caps") and not args.get("floors"):
        return BadRequest("bad_argument", "a pivot needs 'caps' or 'floors' to change")
    unexpected = sorted(k for k in args if k not in ("caps", "floors"))
    if unexpected:
        return BadRequest("bad_argument", f"unexpected argument(s) {', '.join(unexpected)}")
    return Pivot(caps=dict(tables["caps"]), floors=dict(tables["floors"]))
