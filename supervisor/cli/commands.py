"""One function per command: each takes the parsed arguments and returns the exit status."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwarden.supervisor.cli.output import (
    describe_result,
    format_checkpoints,
    format_dump,
    format_status,
    newest_first,
    print_json,
    print_progress,
    stop_status,
)
from trainwarden.supervisor.cli.reach import client_for, daemon_target, run_dir_of
from trainwarden.supervisor.errors import (
    CommandRefused,
    ConfigError,
    DaemonNotRunning,
    NobodyAnswers,
    UsageError,
)

if TYPE_CHECKING:
    from trainwarden.supervisor.protocol import (
        DumpResult,
        PivotResult,
        StatusResult,
    )


def cmd_init(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.init import cpu_warning, write_config

    path = write_config(
        run_dir_of(args),
        preset=args.preset,
        steps=args.steps,
        save_every=args.save_every,
        force=args.force,
        device=args.device,
        extra_args=[
            flag
            for flag, on in (("--compile", args.compile), ("--sync-save", args.sync_save))
            if on
        ],
    )
    print(f"wrote {path}")
    print(f"start it with: trainwarden daemon --detach {path.parent}")
    warning = cpu_warning(args.preset, args.device)
    if warning:
        print(f"trainwarden init: {warning}", file=sys.stderr)
    return 0


def cmd_daemon(args: argparse.Namespace) -> int:
    # Held from here on, not lost: a job's pre-timeout signal (USR1 unless [slurm] signal
    # names another) may come while the daemon still imports and starts, and its default
    # action would end it. Daemon.run lets them through once its handler is in.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        return _daemon(args)
    finally:
        # As it was before: a command that ends before the daemon runs (a config error)
        # must not leave the signal held in a process that goes on (one that called
        # main(), a test's), nor in the processes it starts next.
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _daemon(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.start_checks import check_mirror_owner, load_for_start
    from trainwarden.supervisor.config_checks import slurm_signal
    from trainwarden.supervisor.config_trainer import check_trainer_program

    run_dir = run_dir_of(args)
    cfg = load_for_start(run_dir)
    job_signal = slurm_signal(cfg.slurm.signal)
    if job_signal is not None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {job_signal})
    check_trainer_program(cfg)
    check_mirror_owner(cfg)
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

    try:
        daemon = Daemon(cfg, Notifier.from_env(os.environ))
    except ConfigError as exc:
        # A plugin judges its own options: name the file they came from, as load_config does.
        message = str(exc)
        raise ConfigError(
            message if message.startswith(str(cfg.path)) else f"{cfg.path}: {message}"
        ) from None
    return asyncio.run(daemon.run())


def cmd_status(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        status: StatusResult = client.request("status")
    if args.json:
        print_json({**status, "checkpoints": newest_first(status.get("checkpoints") or [])})
        return 0
    print(format_status(status))
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.config import CONFIG_NAME

    try:
        with client_for(args) as client:
            result: Any = client.request("checkpoints")
    except DaemonNotRunning:
        # No daemon: a run directory can still be read as it is (never a bare socket).
        if args.socket or not (run_dir_of(args) / CONFIG_NAME).exists():
            raise
        from trainwarden.supervisor.cli.offline import checkpoints_from_directory

        result = checkpoints_from_directory(run_dir_of(args))
    if args.json:
        print_json({**result, "checkpoints": newest_first(result.get("checkpoints") or [])})
        return 0
    print(format_checkpoints(result, time.time()))
    return 0


def cmd_unpin(args: argparse.Namespace) -> int:
    """Unpin; a checkpoint that retention would then delete only with --yes."""
    with client_for(args) as client:
        if not args.yes:
            preview = client.request("unpin", step=args.step, dry_run=True)
            if not preview.get("dry_run"):  # a daemon that cannot preview unpinned it
                return _print_result("unpin", preview, args.json)
            if args.step in (preview.get("would_delete") or []):
                raise CommandRefused(
                    "would_delete",
                    f"unpinned, step {args.step} would be deleted at once by retention "
                    f"(it keeps the newest unpinned ones); add --yes to unpin and delete it",
                )
        result = client.request("unpin", step=args.step)
    return _print_result("unpin", result, args.json)


def _print_result(cmd: str, result: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print_json(result)
    else:
        print(describe_result(cmd, result))
    return 0


def acting(cmd: str, **extra: Any) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        payload = {k: getattr(args, k) for k in extra}
        timeout = None if cmd in ("stop", "shutdown") or getattr(args, "wait", False) else 30.0
        as_json = getattr(args, "json", False)
        try:
            client = client_for(args, timeout=timeout)
        except NobodyAnswers as exc:
            if cmd != "shutdown":
                raise
            # What shutdown is for is already so: say it, and succeed.
            print(f"nothing to shut down: no daemon answers on {exc.socket_path}")
            return 0
        with client:
            result = client.request(cmd, on_progress=None if as_json else print_progress, **payload)
        if as_json:
            print_json(result)
        else:
            print(describe_result(cmd, result))
        return stop_status(result) if cmd in ("stop", "shutdown") else 0

    return run


def cmd_dump(args: argparse.Namespace) -> int:
    with client_for(args, timeout=60.0) as client:
        result: DumpResult = client.request("dump")
    if args.json:
        print_json(result)
        return 0
    print(format_dump(result))
    return 0 if result["path"] is not None else 1


def cmd_pivot(args: argparse.Namespace) -> int:
    caps = _pairs(args.cap, "--cap")
    floors = _pairs(args.floor, "--floor")
    if not caps and not floors:
        raise UsageError("pivot needs at least one --cap ARM=X or --floor ARM=X")
    with client_for(args, timeout=None) as client:
        result: PivotResult = client.request("pivot", caps=caps, floors=floors)
    if args.json:
        print_json(result)
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
    import pwd
    import shutil
    import subprocess

    from trainwarden.supervisor.cli import units
    from trainwarden.supervisor.cli.start_checks import load_for_start

    run_dir = run_dir_of(args)
    cfg = load_for_start(run_dir)
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
    warning = units.bare_program_warning(
        kind, cfg.trainer.command, cfg.trainer.env, Path(sys.executable).parent
    )
    if warning:
        print(f"trainwarden install-unit: {warning}", file=sys.stderr)
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
    from trainwarden.tui.launch import main as tui_main

    compare = args.compare
    if compare is not None and Path(compare).expanduser().exists():
        # A path on this machine; one that is not is the daemon's to find (over SSH).
        compare = str(Path(compare).expanduser().resolve())
    socket_path, daemon_uid, cfg = daemon_target(args)
    return tui_main(
        socket_path,
        read_only=args.read_only,
        log_path=cfg.log_path if cfg is not None else None,
        compare=compare,
        daemon_uid=daemon_uid,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.demo import run_demo

    run_dir = Path(args.run_dir).expanduser().resolve() if args.run_dir else None
    return run_demo(run_dir, fresh=args.fresh)


def cmd_restore(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.store.restore import restore

    config = Path(args.config).expanduser() if args.config else None
    print(restore(run_dir_of(args), Path(args.mirror).expanduser(), config_from=config))
    return 0
