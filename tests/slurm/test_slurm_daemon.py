"""`trainwarden daemon` as a real batch job's main process: it knows its job, and the time
limit the real scontrol reports for it (`sbatch --time=5`: 5 minutes), in `status`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support import DaemonProcess, scripted_run, wait_for
from tests.support.daemon import DAEMON
from tests.support.slurm import SlurmCluster


def test_a_daemon_in_a_batch_job_knows_its_job_and_its_limit(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.05")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + " ".join([*DAEMON, str(run_dir)]) + "\n")
    job_id = slurm.sbatch(
        "--job-name=train-gpt", "--time=5", f"--output={tmp_path / 'job.out'}", str(script)
    )
    client = DaemonProcess(run_dir)  # only to ask: the job started the daemon

    def answered() -> dict[str, Any] | None:
        try:
            job = client.status().get("slurm")
        except Exception:
            return None
        return job if job and job.get("limit_note") != "being read" else None

    try:
        job = wait_for(answered, timeout=20, what="status with the job's limit")
        assert job["job_id"] == str(job_id) and job["name"] == "train-gpt"
        assert job["partition"] == "debug" and job["restart_count"] == 0
        assert job["time_limit_s"] == 300, job
        assert 240 < job["ends_in_s"] <= 300, job
    finally:
        slurm.run("scancel", str(job_id), check=False)
        slurm.wait_for_job(job_id)
