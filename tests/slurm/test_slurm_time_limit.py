"""The reference trainer chained across Slurm time limits (the slow tier: about three
minutes, most of it Slurm's own waits): a batch job of 2 minutes with `--signal=B:USR1@60`
saves, requeues and resumes segment after segment until the run is done, and its final
checkpoint is bit-identical to the same run trained straight through."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import journal, reference_run
from tests.support.daemon import DAEMON
from tests.support.runs import trainer_argv
from tests.support.slurm import SlurmCluster

STEPS = 4500
SAVE_EVERY = 500
STEP_SLEEP_S = "0.02"
"""The chained run's steps are slowed (not the straight run's: a sleep changes no number),
so a segment of 25-55 s of training holds at most about 2,000 steps: the run needs at least
three segments, whatever the machine's speed."""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_chained_across_time_limits_ends_bit_identical_to_a_straight_run(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    straight_dir = tmp_path / "straight"
    straight_dir.mkdir()
    with open(straight_dir / "stdout.txt", "wb") as out:
        straight = subprocess.Popen(
            trainer_argv(STEPS, SAVE_EVERY), cwd=straight_dir, stdout=out, stderr=out
        )
    run_dir = reference_run(
        tmp_path / "run",
        STEPS,
        SAVE_EVERY,
        trainer={"env": {"TRAINER_TEST_STEP_SLEEP_S": STEP_SLEEP_S}},
        slurm={"act_before_end_s": 0},
    )
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + " ".join([*DAEMON, str(run_dir)]) + "\n")
    job_id = slurm.sbatch(
        "--requeue",
        "--open-mode=append",
        "--time=2",
        "--signal=B:USR1@60",
        f"--output={tmp_path / 'job.out'}",
        str(script),
    )
    try:
        assert straight.wait(600) == 0
        ended = slurm.wait_for_job(job_id, timeout=840)
        assert (ended["JobState"], ended["ExitCode"]) == ("COMPLETED", "0:0"), ended
        records = journal(run_dir)
        segments = [r for r in records if r["kind"] == "slurm_job"]
        restarts = int(ended["Restarts"])
        assert restarts >= 2, ended
        # One segment record per job segment, in order, each a requeue of the same job.
        assert [s["segment"] for s in segments] == list(range(1, restarts + 2))
        assert [s["restart_count"] for s in segments] == list(range(restarts + 1))
        assert {s["job_id"] for s in segments} == {str(job_id)}
        assert [r["code"] for r in records if r["kind"] == "daemon_exit"] == [75] * restarts + [0]
        asked = [r for r in records if r["kind"] == "slurm_requeue_requested"]
        assert [r["why"] for r in asked] == ["SIGUSR1"] * restarts
        # Each stop saved its last step: nothing lost beyond the save, and the next
        # segment resumed from exactly that checkpoint.
        outcomes = [r for r in records if r["kind"] == "stop_outcome"]
        assert [(o["outcome"], o["steps_lost"]) for o in outcomes] == [("saved", 0)] * restarts
        resumed = [r["resume"]["step"] for r in records if r["kind"] == "spawn" and r["resume"]]
        assert resumed == [o["checkpoint_step"] for o in outcomes]
        name = f"step_{STEPS:06d}.bin"
        final = (run_dir / "checkpoints" / name).read_bytes()
        assert final == (straight_dir / "checkpoints" / name).read_bytes()
    finally:
        if straight.poll() is None:
            straight.kill()
            straight.wait()
        slurm.run("scancel", str(job_id), check=False)
        slurm.wait_for_job(job_id, timeout=60)
