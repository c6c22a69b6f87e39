"""The script `trainwarden slurm-script` prints, submitted as printed to a real Slurm: the
job starts the run's daemon, which answers `status` from inside that job, and the stop the
script recommends ends the job with a save."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.support import PYTHON, DaemonProcess, checkpoints, journal, scripted_run, wait_for
from tests.support.slurm import SlurmCluster


def printed_script(run_dir: Path, *options: str) -> str:
    done = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "slurm-script", str(run_dir), *options],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_printed_script_runs_the_daemon_as_the_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    # One save only, the stop's, and slower than the cluster's KillWait (5 s).
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps", "100000", "--dt", "0.05", "--save-every", "1000000", "--slow-save", "8",
    )  # fmt: skip
    script = tmp_path / "job.sh"
    # The test cluster's node has no GPUs; its partition allows 10 minutes.
    script.write_text(printed_script(run_dir, "--gpus", "0", "--time", "5", "--signal-lead", "60"))
    job_id = slurm.sbatch(str(script))
    client = DaemonProcess(run_dir)  # only to ask: the job started the daemon

    def job_seen_by_daemon() -> dict[str, Any] | None:
        try:
            status = client.status()
        except Exception:
            return None
        job = status.get("slurm")
        # A trainer that has logged a step handles SIGTERM; one still starting dies of it.
        return job if job and job.get("job_id") == str(job_id) and status.get("step") else None

    try:
        wait_for(job_seen_by_daemon, timeout=30, what=f"the daemon in job {job_id}")
        fields = slurm.job(job_id)
        assert fields["JobName"] == "run", fields
        assert fields["StdOut"] == f"{run_dir}/slurm-{job_id}.out", fields
        # The script's way to stop: TERM to the daemon alone, which Slurm does not follow
        # with a SIGKILL, so the save may take longer than KillWait.
        slurm.run("scancel", "--batch", "--signal=TERM", str(job_id))
        ended = slurm.wait_for_job(job_id)
        assert ended["JobState"] == "COMPLETED" and ended["ExitCode"] == "0:0", ended
        (outcome,) = [r for r in journal(run_dir) if r["kind"] == "stop_outcome"]
        assert outcome["outcome"] == "saved" and checkpoints(run_dir), outcome
    finally:
        slurm.run("scancel", str(job_id), check=False)
        slurm.wait_for_job(job_id)


def test_sbatch_reads_an_odd_run_directory_as_one_path(slurm: SlurmCluster, tmp_path: Path) -> None:
    # A blank, a # and a % in the folder's name: sbatch would split, cut or expand them.
    run_dir = scripted_run(tmp_path / "a run #1 %j", "--steps", "100000", "--dt", "0.05")
    script = tmp_path / "job.sh"
    script.write_text(
        printed_script(
            run_dir, "--gpus", "0", "--time", "5", "--signal-lead", "60", "--job-name", "a b#"
        )
    )
    job_id = slurm.sbatch(str(script))
    try:
        assert slurm.job(job_id)["JobName"] == "a b#"
        # The file itself, not scontrol's StdOut: scontrol expands a %% of the path unlike
        # the node that opens the file.
        output = run_dir / f"slurm-{job_id}.out"
        wait_for(output.exists, timeout=30, what=f"{output}")
    finally:
        slurm.run("scancel", str(job_id), check=False)
        slurm.wait_for_job(job_id)
