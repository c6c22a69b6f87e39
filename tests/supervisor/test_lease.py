"""The run's lease across machines (store.lease), the pure verdict: whose lease holds,
and when a starting daemon takes the run over."""

from __future__ import annotations

import os
from pathlib import Path

from trainwarden.supervisor.store.lease import (
    STALE_S,
    Lease,
    drop,
    read_lease,
    refusal,
    touch,
    verdict,
    write_lease,
)
from trainwarden.supervisor.store.rundir import RunFiles

ME = Lease(host="node01.cluster", pid=100, started=1000.0, job_id="4242", node="node01")
OTHER_JOB = Lease(host="node07.cluster", pid=812, started=900.0, job_id="999", node="node07")


def judge(held: Lease | None, state: str | None = "RUNNING", touched: float = 1990.0):
    asked: list[str] = []

    def job_state(job: str) -> str | None:
        asked.append(job)
        return state

    return verdict(held, touched, ME, job_state, 2000.0), asked


def test_no_lease_or_its_own_is_taken():
    assert judge(None) == (None, [])
    assert judge(ME) == (None, [])


def test_its_own_jobs_previous_segment_is_taken_without_asking_slurm():
    previous = Lease(host="node03.cluster", pid=5, started=10.0, job_id="4242", node="node03")
    assert judge(previous) == (None, [])


def test_another_running_job_holds_the_run_and_is_named():
    why, asked = judge(OTHER_JOB, "RUNNING")
    assert asked == ["999"] and why == "Slurm job 999 on node07 (daemon pid 812), running"
    line = refusal(Path("/runs/a"), why, OTHER_JOB)
    assert line == (
        "/runs/a is already supervised by Slurm job 999 on node07 (daemon pid 812), running;"
        " it is taken over once that job ends (`scancel 999` ends it)"
    )


def test_a_job_that_no_longer_runs_holds_nothing():
    for state in ("COMPLETED", "CANCELLED", "TIMEOUT", "FAILED", "PENDING", "NODE_FAIL", ""):
        assert judge(OTHER_JOB, state)[0] is None, state


def test_when_slurm_cannot_say_the_lease_is_judged_by_its_age():
    assert judge(OTHER_JOB, None, touched=2000.0 - 10)[0] == (
        "Slurm job 999 on node07 (daemon pid 812), its lease touched 10 s ago"
    )
    assert judge(OTHER_JOB, None, touched=2000.0 - STALE_S)[0] is None


def test_a_daemon_in_no_job_elsewhere_holds_while_it_touches_its_lease():
    elsewhere = Lease(host="ws.lab", pid=77, started=0.0)
    assert judge(elsewhere, touched=1995.0)[0] == (
        "the daemon with pid 77 on ws.lab, its lease touched 5 s ago"
    )
    assert judge(elsewhere, touched=2000.0 - STALE_S - 1)[0] is None
    assert "trainwarden shutdown /r` on ws.lab" in refusal(Path("/r"), "x", elsewhere)


def test_on_this_machine_the_runs_lock_judges():
    here = Lease(host=ME.host, pid=55, started=0.0)
    assert judge(here, touched=2000.0) == (None, [])


def test_written_read_touched_and_dropped_only_by_its_holder(tmp_path: Path):
    files = RunFiles(tmp_path)
    files.make_state_dir()
    assert read_lease(files) == (None, None)
    write_lease(files, ME)
    held, touched = read_lease(files)
    assert held == ME and touched is not None
    drop(files, OTHER_JOB)  # not its holder: left alone
    assert read_lease(files)[0] == ME
    path = files.state_dir / "lease.json"

    os.utime(path, (1.0, 1.0))
    touch(files, OTHER_JOB)
    assert path.stat().st_mtime == 1.0
    touch(files, ME)
    assert path.stat().st_mtime > 1.0
    drop(files, ME)
    assert not path.exists()
    path.write_text("{not json")
    assert read_lease(files) == (None, None)


def test_a_link_or_a_fifo_in_the_leases_place_is_no_lease_and_no_hang(tmp_path: Path):
    files = RunFiles(tmp_path / "run")
    files.make_state_dir()
    path = files.state_dir / "lease.json"
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(
        '{"host": "node07", "pid": 1, "started": 0, "job_id": "999", "node": "node07"}'
    )
    path.symlink_to(elsewhere)
    assert read_lease(files) == (None, None)
    path.unlink()
    os.mkfifo(path)  # an open for reading would wait for a writer forever
    assert read_lease(files) == (None, None)
    write_lease(files, ME)  # replaced by the daemon's own
    assert read_lease(files)[0] == ME
