"""The Slurm fixture itself: a batch job runs on the real one-node cluster and its output
lands where `--output` says. Start-up measured at about 1 s on the 2-core machine (the node
idle), so the module stays in the default tier."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.slurm import SlurmCluster


def test_batch_job_runs_and_writes_its_output(slurm: SlurmCluster, tmp_path: Path) -> None:
    output = tmp_path / "hello.out"
    submitted = time.monotonic()
    job_id = slurm.sbatch(f"--output={output}", "--wrap", "echo hello")
    fields = slurm.wait_for_job(job_id)
    took = time.monotonic() - submitted
    print(f"\nslurm: start-up {slurm.startup_s:.2f} s, job {job_id} {took:.2f} s")
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["ExitCode"] == "0:0", fields
    assert output.read_text() == "hello\n"
