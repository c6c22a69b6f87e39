"""`trainwarden slurm-script RUN`: an sbatch script that runs the run's daemon as a Slurm job.

The daemon is the batch step's main process. Before each time limit Slurm signals it, it
stops the trainer with a verified save, requeues the job and exits 75; the next segment
resumes from the newest verified checkpoint. `script_text` builds the script and does no
I/O; `cmd_slurm_script` reads the config, checks the options and prints it.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from trainwarden.supervisor.errors import UsageError

MAX_SIGNAL_LEAD_S = 65535
"""The longest lead sbatch --signal accepts, in seconds."""

_SBATCH_SPECIAL = re.compile(r"[\s\"'\\#]")


def sbatch_word(text: str, what: str) -> str:
    """`text` as one word of an #SBATCH line. sbatch splits those lines at blanks and reads
    `#` as the start of a comment, so such a word is quoted and `\\ " ' #` escaped."""
    if "\n" in text or "\r" in text:
        raise UsageError(f"{what} {text!r} holds a line break, which an #SBATCH line cannot")
    if not _SBATCH_SPECIAL.search(text):
        return text
    return '"' + re.sub(r"([\\\"'#])", r"\\\1", text) + '"'


def output_pattern(run_dir: Path) -> str:
    """RUN/slurm-%j.out as an sbatch --output pattern: a `%` of the path is doubled, or
    Slurm would read it as a placeholder such as %j."""
    return str(run_dir).replace("%", "%%") + "/slurm-%j.out"


def daemon_command() -> list[str]:
    """The words that start this installation's daemon: its `trainwarden` script beside
    this Python when there is one, else this Python with `-m`."""
    exe = Path(sys.executable).parent / "trainwarden"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "trainwarden.supervisor"]


def script_text(
    *,
    run_dir: Path,
    command: list[str],
    job_name: str,
    time: str,
    signal_name: str,
    signal_lead_s: int,
    gpus: int = 1,
    partition: str | None = None,
    cpus_per_task: int | None = None,
) -> str:
    """The sbatch script for the run in `run_dir` (absolute). `command` starts the daemon
    (daemon_command), `signal_name` is without SIG ("USR1")."""
    run = shlex.quote(str(run_dir))
    trainwarden = shlex.join(command)
    out = output_pattern(run_dir)
    lines = [
        "#!/bin/bash",
        f"# The Slurm job of the trainwarden run {run_dir}",
        "# (printed by `trainwarden slurm-script`).",
        "#",
        "# Submit:  sbatch FILE",
        f"# Watch:   ssh -t NODE {trainwarden} tui {run}",
        "#          (NODE: `squeue -j JOB -o %N`)",
        "# Stop:    scancel --batch --signal=TERM JOB",
        "#          (the daemon stops the trainer, which saves, and exits 0; the job is not",
        "#          requeued. A plain `scancel JOB` sends TERM too, but Slurm kills what is",
        "#          left KillWait seconds later, 30 by default, whether the save is done or not.)",
        "",
        "# The job's name in squeue.",
        f"#SBATCH --job-name={sbatch_word(job_name, '--job-name')}",
        "# The time limit of one segment. The job runs as many segments as the run needs.",
        f"#SBATCH --time={time}",
        "# Allow a requeue: the daemon requeues the job before each time limit, and Slurm",
        "# requeues it after a node failure.",
        "#SBATCH --requeue",
        f"# {signal_name} {signal_lead_s} s before the time limit, to the batch shell alone (B:),",
        "# which is the daemon: the trainer saves, the daemon requeues the job and exits 75.",
        "# The lead must cover the save. Slurm may send the signal up to 60 s early.",
        f"#SBATCH --signal=B:{signal_name}@{signal_lead_s}",
        "# On a requeue Slurm opens the output file again, and the default truncate mode",
        "# would erase the earlier segments' output.",
        "#SBATCH --open-mode=append",
        "# The daemon's output, one file for all segments (%j: the job's id, kept on a requeue).",
        f"#SBATCH --output={sbatch_word(out, '--output')}",
        "# One node and one task, the daemon. The trainer it starts uses the job's",
        "# CPUs and GPUs.",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
    ]
    if gpus > 0:
        lines += ["# The GPUs the trainer gets.", f"#SBATCH --gpus={gpus}"]
    if cpus_per_task is not None:
        lines += [
            "# The CPUs the trainer gets, data loaders included.",
            f"#SBATCH --cpus-per-task={cpus_per_task}",
        ]
    else:
        lines += [
            "# Without this line the job may get one CPU, which the trainer's data loaders",
            "# then share. Remove one # to set it.",
            "##SBATCH --cpus-per-task=N",
        ]
    if partition is not None:
        lines += [
            "# The partition to run in.",
            f"#SBATCH --partition={sbatch_word(partition, '--partition')}",
        ]
    else:
        lines += [
            "# The partition to run in (the cluster's default without it). Remove one # to set it.",
            "##SBATCH --partition=NAME",
        ]
    lines += [
        "",
        "# exec makes the daemon the batch step's main process, so the signal and scancel",
        "# reach it. Its exit status is the contract in docs/exit-codes.md: 0 finished or",
        "# stopped, 3 halted, 75 requeued.",
        f"exec {trainwarden} daemon {run}",
    ]
    return "\n".join(lines) + "\n"


def time_limit_s(text: str) -> int:
    """--time in seconds; UsageError for what sbatch would not read as a limit."""
    from trainwarden.supervisor.inputs.slurm_job import parse_duration

    seconds = parse_duration(text)
    if seconds is None:
        raise UsageError(
            f"--time {text!r}: expected Slurm's [days-]hours:minutes:seconds or minutes,"
            " for example --time 1-00:00:00 or --time 2:00:00"
        )
    if seconds == 0:
        raise UsageError(
            f"--time {text!r}: Slurm reads 0 as no time limit, and the signal comes before"
            " one; give a limit, for example --time 1-00:00:00"
        )
    return seconds


def check_signal_lead(lead_s: int, time: str, limit_s: int) -> None:
    """UsageError for a lead sbatch refuses, or one that would signal before the job starts."""
    if lead_s <= 0:
        raise UsageError(
            f"--signal-lead {lead_s}: expected seconds > 0 before the time limit, for"
            " example --signal-lead 300"
        )
    if lead_s >= limit_s:
        raise UsageError(
            f"--signal-lead {lead_s} is not smaller than --time {time} ({limit_s} s):"
            " give a shorter lead or a longer time"
        )
    if lead_s > MAX_SIGNAL_LEAD_S:
        raise UsageError(
            f"--signal-lead {lead_s}: sbatch takes at most {MAX_SIGNAL_LEAD_S} s;"
            " give a shorter lead"
        )


def cmd_slurm_script(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.start_checks import load_for_start
    from trainwarden.supervisor.config_checks import slurm_signal

    run_dir = Path(args.run_dir).expanduser().resolve()
    cfg = load_for_start(run_dir)
    limit_s = time_limit_s(args.time)
    check_signal_lead(args.signal_lead, args.time, limit_s)
    if args.gpus < 0:
        raise UsageError(f"--gpus {args.gpus}: expected 0 or more (0: no GPU line)")
    if args.cpus_per_task is not None and args.cpus_per_task < 1:
        raise UsageError(f"--cpus-per-task {args.cpus_per_task}: expected 1 or more")
    sig = slurm_signal(cfg.slurm.signal)
    assert sig is not None  # load_config refuses a signal it cannot name
    if args.signal_lead < cfg.trainer.stop_timeout_s:
        print(
            f"trainwarden slurm-script: --signal-lead {args.signal_lead} is less than [trainer]"
            f" stop_timeout_s = {cfg.trainer.stop_timeout_s:g}: a save that takes longer is"
            " cut off by the time limit",
            file=sys.stderr,
        )
    if not cfg.slurm.requeue:
        print(
            "trainwarden slurm-script: [slurm] requeue = false leaves the requeue to the batch"
            " script, and this one hands its shell to the daemon (exec): the job ends with"
            " status 75 and is not requeued",
            file=sys.stderr,
        )
    text = script_text(
        run_dir=run_dir,
        command=daemon_command(),
        job_name=args.job_name if args.job_name is not None else cfg.run.name,
        time=args.time.strip(),
        signal_name=sig.name.removeprefix("SIG"),
        signal_lead_s=args.signal_lead,
        gpus=args.gpus,
        partition=args.partition,
        cpus_per_task=args.cpus_per_task,
    )
    sys.stdout.write(text)
    return 0
