"""The daemon inside a Slurm job: the job read from the environment, its time limit from
`scontrol show job -o` (parsed from lines a real slurmctld printed), journaled once at the
start (`slurm_job`) and shown in `status`. Outside a job nothing is written and the field
is None; an scontrol that fails leaves the limit unknown and the run supervised."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.support import DaemonProcess, journal, scripted_run, wait_for
from tests.support.slurm import JOB_ENV, fake_scontrol
from trainwarden.supervisor.cli.output import format_status
from trainwarden.supervisor.inputs.slurm_job import (
    JobLimit,
    job_from_env,
    limit_from_show_job,
    parse_duration,
    read_limit,
    show_job_fields,
)
from trainwarden.supervisor.journal_text import slurm_short_text, slurm_text, summary

pytestmark = pytest.mark.timeout(120)

# Printed by the real one-node Slurm of tests/support/slurm.py (slurm-wlm 23.x) for
# `sbatch --job-name=train-gpt --time=5 --wrap ...`, running, then still pending.
RUNNING = (
    "JobId=1 JobName=train-gpt UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759"
    " Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null)"
    " Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00"
    " TimeLimit=00:05:00 TimeMin=N/A SubmitTime=2026-12-05T15:57:17"
    " EligibleTime=2026-12-05T15:57:17 AccrueTime=2026-12-05T15:57:17"
    " StartTime=2026-12-05T15:57:19 EndTime=2026-12-05T16:02:19 Deadline=N/A"
    " SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-05T15:57:19 Scheduler=Main"
    " Partition=debug AllocNode:Sid=localhost:25562 ReqNodeList=(null) ExcNodeList=(null)"
    " NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*"
    " TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*"
    " MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00"
    " OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null)"
    " WorkDir=/work/main StdErr=/tmp/sj/out.txt StdIn=/dev/null StdOut=/tmp/sj/out.txt Power= "
)
PENDING = (
    "JobId=1 JobName=train-gpt UserId=root(0) GroupId=root(0) MCS_label=N/A"
    " JobState=PENDING Reason=PartitionTimeLimit Dependency=(null) Requeue=1 Restarts=0"
    " BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=02:00:00 TimeMin=N/A"
    " SubmitTime=2026-12-05T15:57:02 StartTime=Unknown EndTime=Unknown Deadline=N/A"
    " Partition=debug AllocNode:Sid=localhost:25562 NodeList= NumNodes=1 Power= "
)


def local(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# ----------------------------------------------------------------------------- parsing


def test_a_real_show_job_line_gives_the_limit_and_the_end():
    fields = show_job_fields(RUNNING)
    assert fields["AllocNode:Sid"] == "localhost:25562" and fields["CPUs/Task"] == "1"
    assert fields["TRES"] == "cpu=1,node=1,billing=1" and fields["Power"] == ""
    limit = limit_from_show_job(RUNNING)
    assert limit == JobLimit(300, local("2026-12-05T16:02:19"), requeue=True)
    assert limit_from_show_job(RUNNING.replace("Requeue=1", "Requeue=0")).requeue is False
    assert limit_from_show_job(RUNNING.replace(" Requeue=1", "")).requeue is None


def test_a_pending_job_has_its_limit_and_no_end_yet():
    assert limit_from_show_job(PENDING) == JobLimit(7200, None, requeue=True)


def test_no_limit_and_unreadable_limits_are_said_in_words():
    unlimited = limit_from_show_job(RUNNING.replace("TimeLimit=00:05:00", "TimeLimit=UNLIMITED"))
    assert unlimited.unlimited and unlimited.time_limit_s is None and unlimited.end_time is None
    odd = limit_from_show_job(RUNNING.replace("TimeLimit=00:05:00", "TimeLimit=Partition_Limit"))
    assert odd.time_limit_s is None and odd.unknown == "scontrol says TimeLimit=Partition_Limit"
    assert limit_from_show_job("").unknown == "scontrol printed no job"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:05:00", 300),
        ("02:00:00", 7200),
        ("1-00:00:00", 86400),
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("30", 1800),
        ("30:15", 1815),
        ("UNLIMITED", None),
        ("NOT_SET", None),
    ],
)
def test_slurm_durations(text: str, seconds: int | None):
    assert parse_duration(text) == seconds


def test_the_job_from_the_environment():
    job = job_from_env(JOB_ENV, "host-a")
    assert job is not None
    assert (job.job_id, job.name, job.node, job.partition, job.restart_count) == (
        "4242",
        "train-gpt",
        "node01",
        "gpu",
        2,
    )
    # No SLURMD_NODENAME: the node list, then the host name; no restart count: 0.
    bare = job_from_env({"SLURM_JOB_ID": "7", "SLURM_NODELIST": "gpu[01-02]"}, "host-a")
    assert bare is not None and bare.node == "gpu[01-02]" and bare.restart_count == 0
    alone = job_from_env({"SLURM_JOB_ID": "7"}, "host-a")
    assert alone is not None and alone.node == "host-a" and alone.name is None
    assert job_from_env({"SLURM_JOB_NAME": "x"}, "host-a") is None


def test_scontrol_missing_leaves_the_limit_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert read_limit("4242") == JobLimit(None, None, unknown="scontrol not found")


def test_the_job_in_words():
    job = {
        "job_id": "4242",
        "name": "train-gpt",
        "node": "node01",
        "restart_count": 2,
        "time_limit_s": 7200,
        "ends_in_s": 4320.0,
    }
    # A record from before segments were counted: the restart count's.
    assert slurm_text(job) == (
        "job 4242 (train-gpt) on node01, segment 3 (restart count 2), time limit 2h 00m,"
        " ends in 1h 12m"
    )
    counted = {**job, "segment": 4, "gap_s": 130.0, "lost_s": 250.0}
    assert slurm_text(counted) == (
        "job 4242 (train-gpt) on node01, segment 4 (restart count 2), time limit 2h 00m,"
        " ends in 1h 12m, 4m 10s between segments"
    )
    assert slurm_short_text(counted, None) == "job 4242 seg 4"
    first = {**job, "segment": 1, "gap_s": None, "lost_s": 0.0}
    assert "between" not in slurm_text(first) and "segment 1 " in slurm_text(first)
    assert slurm_short_text(job, 4320.0) == "job 4242 seg 3 ends 1h 12m"
    assert slurm_short_text(job, None) == "job 4242 seg 3"
    unknown = {**job, "time_limit_s": None, "ends_in_s": None}
    unknown["limit_note"] = "unknown: scontrol not found"
    assert slurm_text(unknown).endswith("time limit unknown: scontrol not found")
    assert slurm_text({**unknown, "limit_note": "unlimited"}).endswith(", no time limit")


# ----------------------------------------------------------------------------- the daemon


def slurm_record(run_dir: Path) -> dict | None:
    return next((r for r in journal(run_dir) if r["kind"] == "slurm_job"), None)


def test_a_daemon_in_a_job_journals_it_and_shows_it(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.05")
    end = (datetime.now() + timedelta(minutes=72)).replace(microsecond=0)
    start = end - timedelta(hours=2)
    line = (
        RUNNING.replace("JobId=1 ", "JobId=4242 ")
        .replace("TimeLimit=00:05:00", "TimeLimit=02:00:00")
        .replace("StartTime=2026-12-05T15:57:19", f"StartTime={start.isoformat()}")
        .replace("EndTime=2026-12-05T16:02:19", f"EndTime={end.isoformat()}")
    )
    asked = tmp_path / "asked"
    env = fake_scontrol(tmp_path / "bin", f"echo \"$*\" > {asked}\necho '{line}'")
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        record = wait_for(lambda: slurm_record(run_dir), timeout=30, what="a slurm_job record")
        assert asked.read_text() == "show job -o 4242\n"
        assert record["job_id"] == "4242" and record["name"] == "train-gpt"
        assert (record["node"], record["partition"], record["restart_count"]) == (
            "node01",
            "gpu",
            2,
        )
        assert record["time_limit_s"] == 7200 and record["end_time"] == end.timestamp()
        assert record["limit_note"] is None
        assert summary(record).startswith(
            "job 4242 (train-gpt) on node01, segment 1 (restart count 2), time limit 2h 00m"
        )
        status = daemon.wait_state("running", timeout=60)
        job = status["slurm"]
        assert job["job_id"] == "4242" and job["time_limit_s"] == 7200
        assert job["end_time"] == end.timestamp()
        assert 72 * 60 - 60 < job["ends_in_s"] <= 72 * 60
        text = format_status(status)
        assert (
            "slurm     job 4242 (train-gpt) on node01, segment 1 (restart count 2),"
            " time limit 2h 00m, ends in 1h 1" in text
        ), text
        kinds = [r["kind"] for r in journal(run_dir)]
        assert kinds.count("slurm_job") == 1 and kinds.index("daemon_start") < kinds.index(
            "slurm_job"
        )
    finally:
        daemon.cleanup()


def test_outside_a_job_there_is_no_record_and_no_field(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "30", "--save-every", "10")
    daemon = DaemonProcess(run_dir)
    for name in [n for n in daemon.env if n.startswith("SLURM")]:
        del daemon.env[name]
    try:
        daemon.start()
        status = daemon.wait_state("finished", timeout=60)
        assert status["slurm"] is None
        assert "slurm" not in format_status(status)
        assert slurm_record(run_dir) is None
    finally:
        daemon.cleanup()


def test_a_failing_scontrol_leaves_the_limit_unknown_and_the_run_supervised(tmp_path: Path):
    # exit_when_ended off: the finished run's daemon stays up to be asked.
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "30", "--save-every", "10", slurm={"exit_when_ended": False}
    )
    env = fake_scontrol(
        tmp_path / "bin", "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1"
    )
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        status = daemon.wait_state("finished", timeout=60)
        assert status["step"] == 30
        record = wait_for(lambda: slurm_record(run_dir), timeout=30, what="a slurm_job record")
        why = "unknown: scontrol exited 1: slurm_load_jobs error: Invalid job id specified"
        assert record["time_limit_s"] is None and record["end_time"] is None
        assert record["limit_note"] == why
        job = daemon.status()["slurm"]
        assert job["job_id"] == "4242" and job["ends_in_s"] is None
        assert f"time limit {why}" in format_status(daemon.status())
    finally:
        daemon.cleanup()
