"""`trainwarden slurm-script RUN`: the sbatch script it prints, and the options it refuses.

The first test runs the command as a subprocess, as an operator runs it; the others call
the CLI's `main` in this process, which prints and exits the same, for a fraction of the
start-up. No Slurm is needed here (the script running as a real job is
tests/slurm/test_slurm_script_job.py).
"""

from __future__ import annotations

import contextlib
import io
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import PYTHON, scripted_run
from trainwarden.supervisor.cli.main import main


def cli(*args: str, cwd: Path, own_process: bool = False) -> subprocess.CompletedProcess[str]:
    if own_process:
        return subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=cwd,
        )
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def script_for(
    tmp_path: Path, *options: str, own_process: bool = False, **tables: dict[str, object]
) -> tuple[Path, str]:
    """A scripted run at tmp_path/run and the script printed for it (named relatively)."""
    run_dir = scripted_run(tmp_path / "run", "--steps", "10", **tables)
    done = cli("slurm-script", "run", *options, cwd=tmp_path, own_process=own_process)
    assert done.returncode == 0, done.stderr
    return run_dir, done.stdout


def test_the_script_runs_the_daemon_for_the_run_and_is_requeued_before_its_limit(
    tmp_path: Path,
) -> None:
    run_dir, text = script_for(
        tmp_path, "--job-name", "gpt", "--partition", "gpu", own_process=True
    )
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in [
        "#SBATCH --job-name=gpt",
        "#SBATCH --time=1-00:00:00",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={run_dir}/slurm-%j.out",
        "#SBATCH --gpus=1",
        "#SBATCH --partition=gpu",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
    ]:
        assert line in lines, f"{line!r} not in:\n{text}"
    # The daemon replaces the shell, and it is started for the absolute run directory.
    exec_line = lines[-1]
    words = shlex.split(exec_line)
    assert words[0] == "exec" and words[-2:] == ["daemon", str(run_dir)], exec_line
    assert Path(words[1]).is_absolute()
    # Comments say what the settings are for; the append mode's reason is the one a reader
    # would otherwise undo.
    assert "truncate" in text and "scancel" in text and "sbatch FILE" in text
    assert "docs/exit-codes.md" in text


def test_without_a_partition_its_line_is_a_commented_placeholder(tmp_path: Path) -> None:
    _, text = script_for(tmp_path)
    lines = text.splitlines()
    assert "##SBATCH --partition=NAME" in lines
    assert not any(line.startswith("#SBATCH --partition") for line in lines)
    assert "#SBATCH --job-name=run" in lines  # the config's run.name


def test_bash_accepts_the_script(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    _, text = script_for(tmp_path, "--cpus-per-task", "8")
    script = tmp_path / "job.sh"
    script.write_text(text)
    done = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --cpus-per-task=8" in text.splitlines()


def test_no_gpus_leaves_the_gpu_line_out(tmp_path: Path) -> None:
    _, text = script_for(tmp_path, "--gpus", "0")
    assert "--gpus" not in text and "gres" not in text


def test_the_signal_is_the_configs_without_its_sig_prefix(tmp_path: Path) -> None:
    _, text = script_for(tmp_path, slurm={"signal": "SIGUSR2"})
    assert "#SBATCH --signal=B:USR2@300" in text.splitlines()


def test_an_odd_run_directory_stays_one_word_for_sbatch_and_for_bash(tmp_path: Path) -> None:
    # sbatch splits #SBATCH lines at blanks, reads # as a comment and % as a placeholder.
    run_dir = scripted_run(tmp_path / "a run #1 %j", "--steps", "10")
    done = cli("slurm-script", str(run_dir), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f'#SBATCH --output="{tmp_path}/a run \\#1 %%j/slurm-%j.out"' in lines
    assert shlex.split(lines[-1])[-1] == str(run_dir)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--time", "2:00:00", "--signal-lead", "7200"], "not smaller than --time"),
        (["--time", "nonsense"], "expected Slurm's"),
        (["--signal-lead", "0"], "expected seconds > 0"),
        (["--time", "0"], "no time limit"),
        (["--gpus", "-1"], "expected 0 or more"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(tmp_path: Path, options: list[str], says: str) -> None:
    scripted_run(tmp_path / "run", "--steps", "10")
    done = cli("slurm-script", "run", *options, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr


def test_a_missing_run_is_exit_2(tmp_path: Path) -> None:
    done = cli("slurm-script", "nowhere", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "nowhere" in done.stderr, done.stderr


def test_a_lead_shorter_than_the_stop_timeout_is_printed_with_a_warning(tmp_path: Path) -> None:
    scripted_run(tmp_path / "run", "--steps", "10")  # stop_timeout_s 10
    done = cli("slurm-script", "run", "--signal-lead", "5", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --signal=B:USR1@5" in done.stdout.splitlines()
    assert "stop_timeout_s = 10" in done.stderr, done.stderr


def test_a_config_that_leaves_the_requeue_to_the_script_is_warned_about(tmp_path: Path) -> None:
    # The script hands its shell to the daemon, so no line of it is left to requeue.
    scripted_run(tmp_path / "run", "--steps", "10", slurm={"requeue": False})
    done = cli("slurm-script", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "requeue = false" in done.stderr and "not requeued" in done.stderr, done.stderr
    assert "#SBATCH --signal=B:USR1@300" in done.stdout.splitlines()
