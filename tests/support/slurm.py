"""A real Slurm on this machine: munged, slurmctld and slurmd started as plain child
processes (no systemd, no /etc files), on free loopback ports, with their config, key,
sockets, state, spool, logs and pid files all inside one temporary folder.

`slurm_cluster()` starts one and yields a `SlurmCluster` (its environment, `sbatch`, a wait
for a job's state); on exit it cancels the jobs left, stops each daemon by its pid (SIGTERM,
then SIGKILL after a timeout), kills by pid whatever process still carries its SLURM_CONF
(a job's slurmstepd, a job's children), and removes the folder. Where Slurm cannot run (a
binary missing, a daemon that exits or never reports the node idle) it raises
`SlurmUnavailable` with a one-line reason, for the caller to skip on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import pid_alive
from tests.support.wait import poll, wait_for
from trainwarden.supervisor.inputs.slurm_job import show_job_fields

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel")

TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)
"""Job states a job never leaves (`scontrol show job` keeps them MinJobAge s)."""

STOP_TIMEOUT_S = 10.0
"""How long a daemon has to exit after SIGTERM before it is SIGKILLed."""


class SlurmUnavailable(Exception):
    """Slurm cannot run here: a binary is missing or a daemon would not start."""


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def parse_job(line: str) -> dict[str, str]:
    """One line of `scontrol show job -o` as key -> value (the daemon's own parser)."""
    return show_job_fields(line.strip())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_line(host: str) -> str:
    """This machine as a NodeName line: `slurmd -C`'s hardware (so slurmd finds what the
    config says, sockets and cores included), half its memory as RealMemory."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    first = out.splitlines()[0] if out else ""
    hardware = dict(pair.split("=", 1) for pair in first.split() if "=" in pair)
    hardware.pop("NodeName", None)
    if "CPUs" not in hardware:
        hardware = {"CPUs": str(os.cpu_count() or 1), "RealMemory": "1024"}
    hardware["RealMemory"] = str(max(1, int(hardware.get("RealMemory", "2048")) // 2))
    pairs = " ".join(f"{key}={value}" for key, value in hardware.items())
    return f"NodeName={host} NodeAddr=127.0.0.1 {pairs} State=UNKNOWN"


def config_text(root: Path, host: str, extra: Sequence[str]) -> str:
    user = os.environ.get("USER") or _user_name()
    lines = [
        "ClusterName=twtest",
        # The address in parentheses: no name lookup, loopback only.
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmUser={user}",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire: how long a requeued job waits before it may start again (120 s by
        # default). With sched_interval below, a requeued job starts again about 7 s after
        # its requeue (144 s with the defaults): the requeue tests wait for it.
        f"AuthInfo=socket={root}/munge.socket,cred_expire=5",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "JobRequeue=1",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        # A batch job is scheduled at submission, not up to 3 s later (the default); the
        # main scheduler looks at the queue every 2 s, not 60 (a requeued job's start).
        "SchedulerParameters=batch_sched_delay=0,sched_interval=2",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        # Without it slurmctld logs "Configured MailProg is invalid" (no mailer installed).
        "MailProg=/bin/true",
        # Seconds between a job's SIGTERM and its SIGKILL (scancel, time limit).
        "KillWait=5",
        # Finished jobs stay visible to `scontrol show job` (no accounting database).
        "MinJobAge=300",
        node_line(host),
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=10 State=UP",
        *extra,
    ]
    return "\n".join(lines) + "\n"


def _user_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _tail(path: Path) -> str:
    """A daemon's last two lines of output on one line (Slurm's `error:` that says why, then
    its `fatal:`)."""
    with contextlib.suppress(OSError):
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return " / ".join(line.strip() for line in lines[-2:])
    return "no output"


@dataclass
class SlurmCluster:
    """A running one-node Slurm; `env` is what its commands need (SLURM_CONF)."""

    root: Path
    env: dict[str, str]
    host: str
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    startup_s: float = 0.0
    """Seconds from starting munged to the node reported idle."""

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster."""
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=30
        )

    def sbatch(self, *args: str) -> int:
        """Submit (`sbatch --parsable ARGS`); the job's id."""
        out = self.run("sbatch", "--parsable", *args).stdout.strip()
        return int(out.split(";", 1)[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job -o` of one job as key -> value ({} once Slurm forgot it)."""
        done = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        return parse_job(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}

    def wait_for_job(
        self, job_id: int, states: frozenset[str] = TERMINAL_STATES, timeout: float = 60.0
    ) -> dict[str, str]:
        """The job's fields once its JobState is one of `states` (by default: finished)."""

        def reached() -> dict[str, str] | None:
            fields = self.job(job_id)
            return fields if fields.get("JobState") in states else None

        result: dict[str, str] = wait_for(
            reached, timeout, interval=0.1, what=f"job {job_id} in {sorted(states)}"
        )
        return result

    def owned_pids(self) -> list[int]:
        """Live processes that carry this cluster's SLURM_CONF: the daemons, slurmstepd and
        the jobs (sbatch exports its environment to them)."""
        marker = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{entry}/environ").read_bytes()
                if marker in environ.split(b"\0") and pid_alive(int(entry)):
                    pids.append(int(entry))
        return pids

    def stop(self) -> None:
        """Cancel the jobs left, stop the daemons by pid, kill what still carries our
        SLURM_CONF by pid, remove the folder."""
        ctld = self.daemons.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            queued = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if queued:
                self.run("scancel", *queued, check=False)
                poll(lambda: not self.run("squeue", "-h", check=False).stdout.strip(), 15.0, 0.2)
        # slurmd before slurmctld (it reports to it), munged last (both use it).
        for name in ("slurmd", "slurmctld", "munged"):
            process = self.daemons.get(name)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in self.owned_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        poll(lambda: not self.owned_pids(), STOP_TIMEOUT_S, 0.05)
        shutil.rmtree(self.root, ignore_errors=True)


def _start(cluster: SlurmCluster, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    with open(cluster.root / f"{name}.out", "wb") as out:
        process = subprocess.Popen(
            argv,
            env=cluster.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C at the terminal reaches pytest, not them
        )
    cluster.daemons[name] = process
    return process


def _alive_or_raise(cluster: SlurmCluster) -> None:
    for name, process in cluster.daemons.items():
        if process.poll() is not None:
            reason = _tail(cluster.root / f"{name}.out")
            raise SlurmUnavailable(f"{name} exited with {process.returncode}: {reason}")


def _munge_socket_ready(cluster: SlurmCluster) -> bool:
    _alive_or_raise(cluster)
    return (cluster.root / "munge.socket").exists()


def _node_state(cluster: SlurmCluster) -> str:
    _alive_or_raise(cluster)
    return cluster.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip()


@contextlib.contextmanager
def slurm_cluster(ready_timeout: float = 30.0, extra: Sequence[str] = ()) -> Iterator[SlurmCluster]:
    """A one-node Slurm on this machine for the block; `extra` lines are appended to its
    slurm.conf (a key given twice: Slurm takes the last). SlurmUnavailable where it cannot
    start."""
    missing = missing_binaries()
    if missing:
        raise SlurmUnavailable(f"Slurm not installed (missing {', '.join(missing)})")
    # Not pytest's tmp_path: a unix socket's path must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="tw-slurm-"))
    # munged warns that a socket in a folder others cannot enter is inaccessible to them.
    root.chmod(0o755)
    host = socket.gethostname().split(".")[0]
    # The caller's own SLURM_* (pytest inside a Slurm job) would point our commands elsewhere.
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    env["SLURM_CONF"] = str(root / "slurm.conf")
    cluster = SlurmCluster(root=root, env=env, host=host)
    try:
        started = time.monotonic()
        for folder in ("state", "spool"):
            (root / folder).mkdir()
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        cluster.conf.write_text(config_text(root, host, extra))
        # -F: in the foreground, so the pid we hold is the daemon's (it forks otherwise);
        # -f: run even as root and with a key outside /etc/munge.
        _start(
            cluster,
            "munged",
            [
                "munged",
                "-F",
                "-f",
                f"--key-file={key}",
                f"--socket={root}/munge.socket",
                f"--pid-file={root}/munged.pid",
                f"--log-file={root}/munged.log",
                f"--seed-file={root}/munged.seed",
            ],
        )
        if not poll(lambda: _munge_socket_ready(cluster), 10.0):
            raise SlurmUnavailable("munged did not create its socket within 10 s")
        _start(cluster, "slurmctld", ["slurmctld", "-D", "-f", str(cluster.conf)])
        _start(cluster, "slurmd", ["slurmd", "-D", "-f", str(cluster.conf), "-N", host])
        if poll(lambda: _node_state(cluster) == "idle", ready_timeout, 0.1) is None:
            raise SlurmUnavailable(
                f"node {host} not idle within {ready_timeout:g} s "
                f"(sinfo: {_node_state(cluster) or 'nothing'}; "
                f"slurmd: {_tail(root / 'slurmd.out')})"
            )
        cluster.startup_s = time.monotonic() - started
        yield cluster
    finally:
        cluster.stop()


JOB_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "train-gpt",
    "SLURMD_NODENAME": "node01",
    "SLURM_JOB_PARTITION": "gpu",
    "SLURM_RESTART_COUNT": "2",
}
"""A job's environment as slurmstepd sets it, for a daemon run without Slurm."""


def fake_scontrol(bin_dir: Path, script: str, **env: str) -> dict[str, str]:
    """`scontrol` on PATH as `script` (sh); JOB_ENV (with `env` over it) and that PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "scontrol"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {**JOB_ENV, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
