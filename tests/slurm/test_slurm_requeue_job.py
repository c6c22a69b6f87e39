"""The daemon as a real Slurm batch job's main process (the one-node Slurm of
tests/support/slurm.py, against the scripted trainer): the requeue signal saves, requeues
and the next segment resumes from the save; a run that finishes ends its job COMPLETED, a
run that diverges for good ends it with the halt's code, `scancel` saves and does not
requeue, and a second job on a run another job supervises is refused in one line, then
takes over once that job has ended. The time-limit chain (three segments, bit-identical to
a straight run) is in the slow tier: test_slurm_time_limit.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support import DaemonProcess, journal, scripted_run, wait_for
from tests.support.daemon import DAEMON
from tests.support.slurm import SlurmCluster


def submit(slurm: SlurmCluster, run_dir: Path, tmp_path: Path, name: str = "job") -> int:
    script = tmp_path / f"{name}.sh"
    script.write_text("#!/bin/sh\nexec " + " ".join([*DAEMON, str(run_dir)]) + "\n")
    return slurm.sbatch(
        "--requeue",
        "--open-mode=append",
        "--time=5",
        f"--output={tmp_path / name}.out",
        str(script),
    )


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


def answering(run_dir: Path, job_id: int, segment: int = 1) -> dict[str, Any] | None:
    """The daemon's status once it answers from job `job_id`'s `segment` with a step."""
    try:
        status = DaemonProcess(run_dir).status()
    except Exception:
        return None
    job = status.get("slurm") or {}
    if job.get("job_id") == str(job_id) and job.get("segment") == segment and status.get("step"):
        return status
    return None


def test_the_requeue_signal_saves_requeues_and_the_next_segment_resumes_from_the_save(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "300", "--dt", "0.02", "--save-every", "1000"
    )
    job_id = submit(slurm, run_dir, tmp_path)
    try:
        wait_for(lambda: answering(run_dir, job_id), timeout=30, what="segment 1")
        # What `--signal=B:USR1@N` sends at the time, sent now: to the batch shell alone.
        slurm.run("scancel", "--batch", "--signal=USR1", str(job_id))
        ended = slurm.wait_for_job(job_id, timeout=120)
        assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == (
            "COMPLETED",
            "0:0",
            "1",
        ), ended
        first, second = records(run_dir, "slurm_job")
        assert (first["segment"], first["restart_count"], first["gap_s"]) == (1, 0, None)
        assert (second["segment"], second["restart_count"]) == (2, 1)
        assert second["gap_s"] > 0 and second["lost_s"] == second["gap_s"]
        (requeued,) = records(run_dir, "slurm_requeue")
        assert requeued["by"] == "scontrol" and requeued["job_id"] == str(job_id)
        (outcome, *_) = records(run_dir, "stop_outcome")
        assert outcome["outcome"] == "saved" and outcome["steps_lost"] == 0, outcome
        resumed = [r for r in records(run_dir, "spawn") if r.get("resume")]
        assert resumed[0]["resume"]["step"] == outcome["checkpoint_step"] > 0
        assert [r["code"] for r in records(run_dir, "daemon_exit")] == [75, 0]
        (done,) = records(run_dir, "slurm_run_ended")
        assert done["phase"] == "finished"
        # Appended, not truncated: both segments' daemons wrote there.
        assert (tmp_path / "job.out").read_text().count("trainwarden.supervisor.inputs.gpu") == 2
        assert not records(run_dir, "slurm_output_truncates")
    finally:
        slurm.run("scancel", str(job_id), check=False)
        slurm.wait_for_job(job_id, timeout=60)


def test_a_run_that_finishes_ends_its_job_completed(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir = scripted_run(tmp_path / "run", "--steps", "30", "--save-every", "10")
    job_id = submit(slurm, run_dir, tmp_path)
    ended = slurm.wait_for_job(job_id, timeout=60)
    assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == ("COMPLETED", "0:0", "0")
    assert records(run_dir, "slurm_run_ended")[0]["code"] == 0


def test_a_run_that_diverges_for_good_ends_its_job_with_the_halts_code(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # A NaN at step 15 in every start: the retry diverges again and the run halts.
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100", "--save-every", "10", "--nan-at", "15"
    )
    job_id = submit(slurm, run_dir, tmp_path)
    ended = slurm.wait_for_job(job_id, timeout=60)
    assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == ("FAILED", "3:0", "0")
    (done,) = records(run_dir, "slurm_run_ended")
    assert (done["phase"], done["code"]) == ("diverged", 3)
    assert not records(run_dir, "slurm_requeue")


def test_scancel_saves_and_does_not_requeue(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000", "--dt", "0.02", "--save-every", "1000000"
    )
    job_id = submit(slurm, run_dir, tmp_path)
    try:
        wait_for(lambda: answering(run_dir, job_id), timeout=30, what="the daemon in its job")
        slurm.run("scancel", str(job_id))
        ended = slurm.wait_for_job(job_id, timeout=60)
        assert (ended["JobState"], ended["Restarts"]) == ("CANCELLED", "0"), ended
        (outcome,) = records(run_dir, "stop_outcome")
        assert outcome["outcome"] == "saved" and outcome["checkpoint_step"], outcome
        assert [r["code"] for r in records(run_dir, "daemon_exit")] == [0]
        assert not records(run_dir, "slurm_requeue")
    finally:
        slurm.run("scancel", str(job_id), check=False)
        slurm.wait_for_job(job_id, timeout=60)


def test_a_second_job_on_a_supervised_run_is_refused_then_takes_over_once_it_ended(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.05")
    first = submit(slurm, run_dir, tmp_path, "first")
    later: list[int] = []
    try:
        wait_for(lambda: answering(run_dir, first), timeout=30, what="the first job's daemon")
        later.append(submit(slurm, run_dir, tmp_path, "second"))
        refused = slurm.wait_for_job(later[-1], timeout=60)
        assert (refused["JobState"], refused["ExitCode"]) == ("FAILED", "1:0"), refused
        said = (tmp_path / "second.out").read_text().strip().splitlines()
        assert len(said) == 1 and said[0].startswith("trainwarden: "), said
        assert f"already supervised by Slurm job {first} on {slurm.host}" in said[0], said
        assert f"`scancel {first}` ends it" in said[0], said
        slurm.run("scancel", str(first))
        slurm.wait_for_job(first, timeout=60)
        later.append(submit(slurm, run_dir, tmp_path, "third"))
        wait_for(
            lambda: answering(run_dir, later[-1], 2), timeout=30, what="the third job's daemon"
        )
    finally:
        for job in (first, *later):
            slurm.run("scancel", str(job), check=False)
            slurm.wait_for_job(job, timeout=60)


def test_an_output_file_sbatch_truncates_is_said_at_the_start(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run_dir = scripted_run(tmp_path / "run", "--steps", "30", "--save-every", "10")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + " ".join([*DAEMON, str(run_dir)]) + "\n")
    output = tmp_path / "job.out"
    job_id = slurm.sbatch("--open-mode=truncate", "--time=5", f"--output={output}", str(script))
    slurm.wait_for_job(job_id, timeout=60)
    (said,) = records(run_dir, "slurm_output_truncates")
    assert said["path"] == str(output)
    assert "add `#SBATCH --open-mode=append`" in output.read_text()
