"""`trainwarden`: the command line. Each command takes the run directory (default: cwd).

Errors are one line on stderr; exit status 2 for bad usage or config, 1 for a failed
operation (no daemon, a refused command).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from trainwarden.supervisor.errors import (
    CommandRefused,
    DaemonNotRunning,
    TrainwardenError,
    UsageError,
)

if TYPE_CHECKING:
    from trainwarden.supervisor.protocol import (
        CheckpointsView,
        EventsResult,
        JournalRecord,
        PivotResult,
        StatusResult,
    )


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def _run_dir(args: argparse.Namespace) -> Path:
    return Path(args.run_dir).expanduser().resolve()


def _socket_path(run_dir: Path) -> Path:
    from trainwarden.supervisor.config import CONFIG_NAME, load_config

    if (run_dir / CONFIG_NAME).exists():
        return load_config(run_dir, check_plugins=False).socket_path
    return run_dir / ".trainwarden" / "control.sock"


def _client(args: argparse.Namespace, timeout: float | None = 30.0) -> Any:
    from trainwarden.supervisor.protocol import Client

    return Client(_socket_path(_run_dir(args)), timeout=timeout)


def _print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


# ----------------------------------------------------------------------------- commands


def cmd_init(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.init import write_config

    path = write_config(
        _run_dir(args),
        preset=args.preset,
        steps=args.steps,
        save_every=args.save_every,
        force=args.force,
        device=args.device,
    )
    print(f"wrote {path}")
    print(f"start it with: trainwarden daemon --detach {path.parent}")
    return 0


def cmd_daemon(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.config import load_config

    run_dir = _run_dir(args)
    cfg = load_config(run_dir)
    if args.detach:
        from trainwarden.supervisor.cli.detach import start_detached

        pid = start_detached(cfg)
        print(f"trainwarden daemon started (pid {pid}) for {run_dir}")
        return 0
    import asyncio
    import logging

    from trainwarden.supervisor.serve.notify import Notifier
    from trainwarden.supervisor.shell.daemon import Daemon

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    import os

    return asyncio.run(Daemon(cfg, Notifier.from_env(os.environ)).run())


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        status: StatusResult = client.request("status")
    if args.json:
        _print_json(status)
        return 0
    print(format_status(status))
    return 0


def _fmt(value: Any, spec: str = "", unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:{spec}}{unit}"


def format_status(s: StatusResult) -> str:
    detail = s.get("detail") or {}
    extra = ""
    if "restart_in_s" in detail:
        extra = f" (restart in {detail['restart_in_s']:.1f} s)"
    elif "reason" in detail:
        extra = f" ({detail['reason']})"
    total = s.get("total_steps")
    step = f"{_fmt(s.get('step'))}" + (f"/{total}" if total else "")
    mfu = s.get("mfu")
    mfu_text = (
        f"{mfu * 100:.2f} %"
        if mfu is not None
        else f"unknown ({s.get('mfu_unknown_reason') or 'n/a'})"
    )
    lines = [
        f"run       {s.get('run')}  ({s.get('run_dir')})",
        f"state     {s.get('state')}{extra}",
        f"trainer   pid {_fmt(s.get('trainer_pid'))}, restarts {s.get('restarts', 0)}",
        f"step      {step}   loss {_fmt(s.get('loss'), '.4f')}   ema {_fmt(s.get('loss_ema'), '.4f')}",
        f"speed     {_fmt(s.get('tokens_per_s'), ',.0f')} tok/s   {_fmt(s.get('steps_per_min'), '.1f')} steps/min   "
        f"eta {_fmt(s.get('eta_s'), '.0f', ' s')}",
        f"mfu       {mfu_text}",
    ]
    gpu = s.get("gpu")
    lines.append(f"gpu       {gpu.get('name') if gpu else 'no NVIDIA GPU'}")
    ckpts = s.get("checkpoints") or []
    names = ", ".join(f"{c['step']}{'*' if c.get('pinned') else ''}" for c in ckpts)
    lines.append(
        f"ckpts     {len(ckpts)} verified: {names or 'none'}"
        + ("  (* pinned)" if "*" in names else "")
    )
    quarantined = s.get("quarantined") or []
    if quarantined:
        lines.append(f"quarant.  {len(quarantined)} file(s) in quarantine/")
    return "\n".join(lines)


def cmd_checkpoints(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result: CheckpointsView = client.request("checkpoints")
    if args.json:
        _print_json(result)
        return 0
    now = time.time()
    print(f"{'step':>10}  {'size':>10}  {'age':>8}  flags")
    for c in result["checkpoints"]:
        flags = " ".join(
            f for f, on in (("pinned", c["pinned"]), ("next-to-delete", c["next_to_delete"])) if on
        )
        print(f"{c['step']:>10}  {_size(c['bytes']):>10}  {_age(now - c['mtime']):>8}  {flags}")
    for q in result["quarantined"]:
        print(f"{'':>10}  quarantined: {q['name']}")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _acting(cmd: str, **extra: Any) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        payload = {k: getattr(args, k) for k in extra}
        timeout = None if cmd in ("stop", "shutdown") or getattr(args, "wait", False) else 30.0
        with _client(args, timeout=timeout) as client:
            result = client.request(cmd, **payload)
        if getattr(args, "json", False):
            _print_json(result)
        else:
            print(describe_result(cmd, result))
        return 0

    return run


def describe_result(cmd: str, result: dict[str, Any]) -> str:
    if cmd == "save":
        if "name" in result:
            return f"checkpoint committed at step {result['step']} ({result['name']})"
        return f"save requested (trainer at step {result.get('step')}); `trainwarden checkpoints` shows it"
    if cmd in ("stop", "shutdown"):
        ckpt = result.get("checkpoint")
        where = f"; newest checkpoint: step {ckpt['step']}" if ckpt else ""
        suffix = " and the daemon is exiting" if cmd == "shutdown" else ""
        return f"trainer stopped{suffix}{where}"
    if cmd == "start":
        resume = result.get("resume_step")
        return f"trainer starting from {'step ' + str(resume) if resume is not None else 'scratch'}"
    if cmd in ("pin", "unpin"):
        return f"step {result['step']} {'pinned' if result['pinned'] else 'unpinned'}"
    return orjson.dumps(result).decode()


def cmd_events(args: argparse.Namespace) -> int:
    with _client(args, timeout=None if args.follow else 30.0) as client:
        recent: EventsResult = client.request("events", n=args.n)
        for record in recent["events"]:
            _print_event(record, args.json)
        if not args.follow:
            return 0
        client.request("subscribe", topics=["events"])
        try:
            while True:
                message = client.read_message()
                if message.get("topic") == "events":
                    _print_event(message["data"], args.json)
        except KeyboardInterrupt:
            return 0


def _print_event(record: JournalRecord, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(orjson.dumps(record).decode() + "\n")
    else:
        fields = {k: v for k, v in record.items() if k not in ("ts", "t", "kind")}
        body = " ".join(f"{k}={orjson.dumps(v).decode()}" for k, v in fields.items())
        sys.stdout.write(f"{record.get('ts', '')}  {record.get('kind', '?'):<18} {body}\n")
    sys.stdout.flush()


def cmd_pivot(args: argparse.Namespace) -> int:
    caps = _pairs(args.cap, "--cap")
    floors = _pairs(args.floor, "--floor")
    if not caps and not floors:
        raise UsageError("pivot needs at least one --cap ARM=X or --floor ARM=X")
    with _client(args, timeout=None) as client:
        result: PivotResult = client.request("pivot", caps=caps, floors=floors)
    if args.json:
        _print_json(result)
    else:
        print(f"pivot done at step {result.get('step')}; archive: {result.get('archive')}")
    return 0


def _pairs(items: list[str] | None, flag: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items or []:
        arm, sep, value = item.partition("=")
        try:
            if not sep or not arm:
                raise ValueError
            out[arm] = float(value)
        except ValueError:
            raise UsageError(
                f"{flag} {item!r}: expected ARM=NUMBER, for example {flag} docs=0.5"
            ) from None
    return out


def cmd_install_unit(args: argparse.Namespace) -> int:
    import os
    import pwd
    import shutil
    import subprocess

    from trainwarden.supervisor.cli import units
    from trainwarden.supervisor.config import load_config

    run_dir = _run_dir(args)
    cfg = load_config(run_dir)
    kind: units.Kind = "system" if args.system or (not args.user and os.getuid() == 0) else "user"
    exe = Path(sys.executable).parent / "trainwarden"
    if not exe.exists():
        found = shutil.which("trainwarden")
        if found is None:
            raise UsageError("cannot find the trainwarden executable; install the package first")
        exe = Path(found)
    user = None
    if kind == "system":
        owner = pwd.getpwuid(run_dir.stat().st_uid).pw_name
        user = args.as_user or owner
    text = units.render_unit(
        kind, exe, run_dir, user, trainer_stop_timeout_s=cfg.trainer.stop_timeout_s
    )
    name = units.unit_name(run_dir)
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    path = units.unit_install_path(kind, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    scope = ["--user"] if kind == "user" else []
    print(f"wrote {path}")
    if args.reload:
        subprocess.run(["systemctl", *scope, "daemon-reload"], check=False)
    else:
        print(f"then: systemctl {' '.join([*scope, 'daemon-reload'])}")
    print(
        f"start it now and at every boot: systemctl {' '.join([*scope, 'enable', '--now', name])}"
    )
    if kind == "user":
        print(
            f"so it runs without you logged in: loginctl enable-linger {pwd.getpwuid(os.getuid()).pw_name}"
        )
    return 0


def cmd_tui(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.config import CONFIG_NAME, load_config
    from trainwarden.tui.app import main as tui_main

    if args.socket:
        return tui_main(Path(args.socket).expanduser(), read_only=args.read_only)
    run_dir = _run_dir(args)
    if not (run_dir / CONFIG_NAME).exists():
        return tui_main(_socket_path(run_dir), read_only=args.read_only)
    cfg = load_config(run_dir, check_plugins=False)
    return tui_main(cfg.socket_path, read_only=args.read_only, log_path=cfg.log_path)


def cmd_demo(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.demo import run_demo

    return run_demo(Path(args.run_dir).expanduser().resolve() if args.run_dir else None)


def cmd_restore(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.store.restore import restore

    config = Path(args.config).expanduser() if args.config else None
    print(restore(_run_dir(args), Path(args.mirror).expanduser(), config_from=config))
    return 0


# ----------------------------------------------------------------------------- parser


def build_parser() -> Parser:
    parser = Parser(prog="trainwarden", description="Supervise a long training run.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def add(
        name: str, func: Callable[[argparse.Namespace], int], help_text: str, *, json: bool = False
    ) -> Parser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "run_dir", nargs="?", default=".", help="run directory (default: current directory)"
        )
        if json:
            p.add_argument("--json", action="store_true", help="print the raw result as JSON")
        p.set_defaults(func=func)
        return p

    p = add("init", cmd_init, "write a trainwarden.toml for the reference trainer")
    p.add_argument("--preset", default="tiny", choices=["tiny", "gpt2-124m"])
    p.add_argument("--steps", type=int, default=2000, help="total steps (default 2000)")
    p.add_argument("--save-every", type=int, default=100, help="checkpoint interval in steps")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--force", action="store_true", help="overwrite an existing config")

    p = add("daemon", cmd_daemon, "run the supervisor daemon (foreground; what systemd runs)")
    p.add_argument(
        "--detach", action="store_true", help="start in the background and return once it answers"
    )

    add("status", cmd_status, "show the run's state and telemetry", json=True)
    add("checkpoints", cmd_checkpoints, "list verified and quarantined checkpoints", json=True)
    p = add("events", cmd_events, "show the journal's newest events", json=True)
    p.add_argument("-n", type=int, default=30, help="how many (default 30)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")

    p = add(
        "save",
        _acting("save", wait=True),
        "ask the trainer for a checkpoint now (SIGUSR1)",
        json=True,
    )
    p.add_argument("--wait", action="store_true", help="return once the checkpoint is committed")
    add("stop", _acting("stop"), "stop the trainer (it saves first); the daemon stays", json=True)
    add("start", _acting("start"), "start the trainer again after stop or a halt", json=True)
    add("shutdown", _acting("shutdown"), "stop the trainer, then the daemon", json=True)
    for name in ("pin", "unpin"):
        p = add(
            name,
            _acting(name, step=True),
            f"{name} a checkpoint (pinned ones are never deleted)",
            json=True,
        )
        p.add_argument("step", type=int, help="the checkpoint's step")

    p = add(
        "restore", cmd_restore, "recreate the run directory from a mirror (after losing its disk)"
    )
    p.add_argument(
        "--from",
        dest="mirror",
        required=True,
        metavar="MIRROR",
        help="the mirror folder ([mirror] path)",
    )
    p.add_argument(
        "--config", metavar="FILE", help="install this trainwarden.toml instead of the mirror's"
    )

    p = add("tui", cmd_tui, "watch and steer the run in a terminal UI (works over SSH)")
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="control socket instead of RUN's (e.g. forwarded with ssh -L)",
    )
    p.add_argument("--read-only", action="store_true", help="watch only: acting keys are refused")
    p = add(
        "demo", cmd_demo, "create a demo run of the reference trainer, supervise it, open the TUI"
    )
    p.set_defaults(run_dir=None)

    p = add(
        "install-unit", cmd_install_unit, "write a systemd unit that runs the daemon for this run"
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--user", action="store_true", help="a unit for `systemctl --user` (default unless root)"
    )
    scope.add_argument("--system", action="store_true", help="a system unit (default for root)")
    p.add_argument("--as-user", help="User= for a system unit (default: the run directory's owner)")
    p.add_argument("--dry-run", action="store_true", help="print the unit and write nothing")
    p.add_argument("--reload", action="store_true", help="run `systemctl daemon-reload` afterwards")

    p = add("pivot", cmd_pivot, "change the data-mixing caps/floors mid-run", json=True)
    p.add_argument(
        "--cap", action="append", metavar="ARM=X", help="new cap for an arm (repeatable)"
    )
    p.add_argument(
        "--floor", action="append", metavar="ARM=X", help="new floor for an arm (repeatable)"
    )
    return parser


def _reorder_step(argv: list[str]) -> list[str]:
    """Allow `pin STEP [RUN_DIR]` as well as `pin RUN_DIR STEP`."""
    if len(argv) >= 2 and argv[0] in ("pin", "unpin"):
        positional = [a for a in argv[1:] if not a.startswith("-")]
        if len(positional) == 2 and positional[0].isdigit() and not positional[1].isdigit():
            rest = [a for a in argv[1:] if a.startswith("-")]
            return [argv[0], positional[1], positional[0], *rest]
        if len(positional) == 1 and positional[0].isdigit():
            rest = [a for a in argv[1:] if a.startswith("-")]
            return [argv[0], ".", positional[0], *rest]
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = _reorder_step(list(sys.argv[1:] if argv is None else argv))
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except CommandRefused as exc:
        print(f"trainwarden: refused ({exc.code}): {exc}", file=sys.stderr)
        return 1
    except DaemonNotRunning as exc:
        print(f"trainwarden: {exc}", file=sys.stderr)
        return 1
    except TrainwardenError as exc:
        print(f"trainwarden: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
