"""The `trainwarden` command line's parser: every command, its arguments and their help,
each bound to the function that runs it (cli.commands; the commands that load something
heavy, such as numpy, apprise or a checkpoint's format, import it when run).

Bad usage is a UsageError (exit status 2) that names the command and points at its help.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from trainwarden.supervisor.cli.commands import (
    acting,
    cmd_checkpoints,
    cmd_daemon,
    cmd_demo,
    cmd_dump,
    cmd_init,
    cmd_install_unit,
    cmd_pivot,
    cmd_restore,
    cmd_status,
    cmd_tui,
    cmd_unpin,
)
from trainwarden.supervisor.cli.events import cmd_events
from trainwarden.supervisor.cli.slurm_script import cmd_slurm_script
from trainwarden.supervisor.errors import UsageError


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # main() says "trainwarden: " once; a subcommand's own name follows it.
        command = self.prog.removeprefix("trainwarden").strip()
        where = f"{command}: " if command else ""
        raise UsageError(f"{where}{message} (see `{self.prog} --help`)")


def build_parser() -> Parser:
    parser = Parser(prog="trainwarden", description="Supervise a long training run.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def add(
        name: str,
        func: Callable[[argparse.Namespace], int],
        help_text: str,
        *,
        json: bool = False,
        run_dir_help: str = "run directory (default: current directory)",
        socket: bool = False,
    ) -> Parser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("run_dir", nargs="?", default=".", help=run_dir_help)
        if json:
            p.add_argument("--json", action="store_true", help="print the raw result as JSON")
        if socket:
            p.add_argument(
                "--socket",
                metavar="PATH",
                help="the daemon's control socket instead of RUN's (e.g. forwarded with ssh -L);"
                " RUN may then be left out",
            )
            p.add_argument(
                "--daemon-user",
                metavar="USER",
                help="the user the daemon runs as, when not you or root: only then is a socket"
                " it serves trusted (from a folder only its owner may write to)",
            )
        p.set_defaults(func=func)
        return p

    p = add("init", cmd_init, "write a trainwarden.toml for the reference trainer")
    p.add_argument("--preset", default="tiny", choices=["tiny", "gpt2-124m"])
    p.add_argument("--steps", type=int, default=2000, help="total steps (default 2000)")
    p.add_argument("--save-every", type=int, default=100, help="checkpoint interval in steps")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--compile", action="store_true", help="the trainer runs its model through torch.compile"
    )
    p.add_argument(
        "--sync-save",
        action="store_true",
        help="the trainer writes checkpoints inside its step loop, not in the background",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing config")

    p = add("daemon", cmd_daemon, "run the supervisor daemon (foreground; what systemd runs)")
    p.add_argument(
        "--detach", action="store_true", help="start in the background and return once it answers"
    )

    add("status", cmd_status, "show the run's state and telemetry", json=True, socket=True)
    add(
        "checkpoints",
        cmd_checkpoints,
        "list the checkpoints, newest first, and the quarantined ones with their reasons"
        " (no daemon: read from the directory)",
        json=True,
        socket=True,
    )
    add(
        "dump",
        cmd_dump,
        "write the trainer's stacks (every thread, every process) to a file now; it keeps running",
        json=True,
        socket=True,
    )
    p = add(
        "events",
        cmd_events,
        "show the journal's newest events, one line each: UTC time, kind, what happened"
        " (state snapshots only with --kind state; --json prints every kind as written);"
        " with no daemon, read from RUN/.trainwarden/journal.jsonl",
        json=True,
        socket=True,
    )
    p.add_argument("-n", type=int, default=30, help="how many, after filtering (default 30)")
    p.add_argument(
        "--kind",
        action="append",
        metavar="KIND",
        help="only records of this kind (repeatable, or comma-separated: crash,spawn);"
        " the text view leaves out state snapshots unless this names state",
    )
    p.add_argument(
        "--since",
        metavar="WHEN",
        help="only records since a duration ago (10m, 2h, 1d) or an ISO time"
        " (2024-05-01T12:00, UTC unless it names a zone)",
    )
    p.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new events (needs the daemon)"
    )

    p = add(
        "save",
        acting("save", wait=True),
        "ask the trainer for a checkpoint now (SIGUSR1)",
        json=True,
        socket=True,
    )
    p.add_argument("--wait", action="store_true", help="return once the checkpoint is committed")
    force_help = (
        "stop a trainer that does not handle SIGTERM anyway: it is killed and its steps"
        " since the newest checkpoint are lost"
    )
    p = add(
        "stop",
        acting("stop", force=True),
        "stop the trainer (it saves first); the daemon stays; exit 1 if steps were lost",
        json=True,
        socket=True,
    )
    p.add_argument("--force", action="store_true", help=force_help)
    p = add(
        "start",
        acting("start", from_scratch=True),
        "start the trainer again after stop or a halt",
        json=True,
        socket=True,
    )
    p.add_argument(
        "--from-scratch",
        action="store_true",
        help="start over at step 0 (only when no verified checkpoint is left: state no_checkpoint)",
    )
    p = add(
        "shutdown",
        acting("shutdown", force=True),
        "stop the trainer, then the daemon; exit 1 if steps were lost",
        json=True,
        socket=True,
    )
    p.add_argument("--force", action="store_true", help=force_help)
    p = add(
        "pin",
        acting("pin", step=True),
        "pin a checkpoint (pinned ones are never deleted)",
        json=True,
        socket=True,
    )
    p.add_argument("step", type=int, help="the checkpoint's step")
    p = add(
        "unpin",
        cmd_unpin,
        "unpin a checkpoint; refused (exit 1) when retention would then delete checkpoints,"
        " unless --yes",
        json=True,
        socket=True,
    )
    p.add_argument("step", type=int, help="the checkpoint's step")
    p.add_argument(
        "--yes", action="store_true", help="unpin even if retention then deletes checkpoints"
    )

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

    p = add(
        "tui", cmd_tui, "watch and steer the run in a terminal UI (works over SSH)", socket=True
    )
    p.add_argument("--read-only", action="store_true", help="watch only: acting keys are refused")
    p.add_argument(
        "--compare",
        metavar="OTHER_RUN",
        help="overlay another run's loss on the chart (a path, or a folder beside the run)",
    )
    p = add(
        "demo",
        cmd_demo,
        "create a demo run of the reference trainer (it crashes, diverges and hangs once each"
        " within its first minute, and trains until stopped), supervise it, open the TUI",
        run_dir_help="run directory (default: ./trainwarden-demo in the current directory)",
    )
    p.set_defaults(run_dir=None)
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over: stop the daemon that supervises the demo run, delete the run's files",
    )

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

    p = add(
        "slurm-script",
        cmd_slurm_script,
        "print an sbatch script that runs the daemon for this run as a Slurm job,"
        " requeued before each time limit",
    )
    p.add_argument(
        "--time",
        default="1-00:00:00",
        help="each segment's time limit, in Slurm's format (default 1-00:00:00)",
    )
    p.add_argument("--partition", help="the partition (default: the line is commented out)")
    p.add_argument(
        "--gpus", type=int, default=1, help="GPUs for the trainer (default 1; 0: no GPU line)"
    )
    p.add_argument("--cpus-per-task", type=int, help="CPUs for the trainer (default: no line)")
    p.add_argument(
        "--signal-lead",
        type=int,
        default=300,
        metavar="SECONDS",
        help="seconds before the time limit at which Slurm signals the daemon to save and"
        " requeue (default 300)",
    )
    p.add_argument("--job-name", help="the job's name (default: the config's run.name)")

    p = add(
        "pivot", cmd_pivot, "change the data-mixing caps/floors mid-run", json=True, socket=True
    )
    p.add_argument(
        "--cap", action="append", metavar="ARM=X", help="new cap for an arm (repeatable)"
    )
    p.add_argument(
        "--floor", action="append", metavar="ARM=X", help="new floor for an arm (repeatable)"
    )

    p = sub.add_parser(
        "compare",
        help="compare the loss of two runs from their branch point (no daemon needed)",
        description="compare the loss of two runs that share an ancestor step (a run and its"
        " branch, or two branches of one run), read from their files",
    )
    p.add_argument("run_a", metavar="RUN_A", help="a run directory")
    p.add_argument("run_b", metavar="RUN_B", help="another run directory")
    p.add_argument("--json", action="store_true", help="print the arrays as JSON")
    p.add_argument(
        "--tolerance",
        type=float,
        help="a loss difference larger than this counts (default 0: any difference)",
    )
    p.add_argument(
        "--window",
        type=int,
        help="the newest steps over which the lower run is judged (default 100)",
    )
    p.set_defaults(func=_compare)

    p = sub.add_parser(
        "branch",
        help="start a new run from a verified checkpoint of another (an audit branch)",
        description="create DEST_RUN from SRC_RUN's newest (or --step) verified checkpoint,"
        " with its config, new caps/floors and overrides; SRC_RUN is only read",
    )
    p.add_argument("src_run", metavar="SRC_RUN", help="the run to branch from")
    p.add_argument("dest_run", metavar="DEST_RUN", help="the new run directory (must not exist)")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the newest verified)")
    p.add_argument("--cap", action="append", metavar="ARM=X", help="cap for an arm (repeatable)")
    p.add_argument(
        "--floor", action="append", metavar="ARM=X", help="floor for an arm (repeatable)"
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="change a config key of the branch, e.g. restart.stall_timeout_s=300 (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print the branch record as JSON")
    p.set_defaults(func=_branch)

    add(
        "alert-test",
        _alert_test,
        "send a test alert to each [alerts] URL and the command (no daemon needed) and print"
        " each one's result; exit 1 if any failed",
    )

    help_text = "what a checkpoint holds: layout, sizes, digest, sidecar, branch (no daemon)"
    p = sub.add_parser("inspect", help=help_text, description=help_text)
    p.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="a checkpoint's path, or a run directory"
    )
    p.add_argument(
        "--step", type=int, help="with a run directory: this step's checkpoint (default: newest)"
    )
    p.add_argument("--json", action="store_true", help="print the raw result as JSON")
    p.set_defaults(func=_inspect)
    help_text = "write a checkpoint's inference weights (no optimizer state) as safetensors"
    p = sub.add_parser("export", help=help_text, description=help_text)
    p.add_argument(
        "source",
        metavar="RUN|CHECKPOINT",
        help="a run directory (its newest verified checkpoint) or a checkpoint's path",
    )
    p.add_argument(
        "--out", required=True, metavar="DIR", help="a new or empty folder to write into"
    )
    p.add_argument(
        "--dtype",
        default="fp32",
        choices=["fp32", "fp16", "bf16"],
        help="the exported weights' type (default fp32)",
    )
    p.add_argument("--step", type=int, help="with a run directory: this step's checkpoint")
    p.add_argument("--json", action="store_true", help="print the raw result as JSON")
    p.set_defaults(func=_export)
    return parser


def _compare(args: argparse.Namespace) -> int:
    # Imported when run: it reads histories with numpy, which other commands never load.
    from trainwarden.supervisor.cli.compare import cmd_compare

    return cmd_compare(args)


def _branch(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.branch import cmd_branch

    return cmd_branch(args)


def _alert_test(args: argparse.Namespace) -> int:
    # Imported when run: apprise is loaded only by the commands that send.
    from trainwarden.supervisor.cli.alerting import cmd_alert_test

    return cmd_alert_test(args)


# inspect and export read a checkpoint's files; their modules are imported when run (every
# other command would pay for them at start).
def _inspect(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.inspection import cmd_inspect

    return cmd_inspect(args)


def _export(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.export import cmd_export

    return cmd_export(args)
