"""`trainwarden init --preset gpt2-124m` warns, in one line on stderr, when the trainer's
interpreter sees no CUDA device; the config is written either way and the exit status is 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainwarden.supervisor.cli.init import cpu_warning, cuda_probe

PYTHON = sys.executable


def init(run_dir: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "init", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **env},
    )


def test_gpt2_without_cuda_warns_on_stderr_and_still_writes_the_config(tmp_path: Path):
    # Hiding every device makes torch report no CUDA in the probe, as on a CPU-only machine.
    result = init(tmp_path / "big", "--preset", "gpt2-124m", env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "big" / "trainwarden.toml").exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("trainwarden init: warning: --preset gpt2-124m will not be")
    assert "practical on CPU" in lines[0]
    assert f"torch.cuda.is_available() in {PYTHON} is False" in lines[0]
    assert "CUDA_VISIBLE_DEVICES=''" in lines[0]
    assert "--preset tiny" in lines[0]
    assert "warning" not in result.stdout


def test_tiny_needs_no_probe_and_says_nothing(tmp_path: Path):
    result = init(tmp_path / "small", env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0 and result.stderr == ""


def test_an_explicit_cpu_device_warns_without_asking_torch():
    def never() -> tuple[bool | None, str]:
        raise AssertionError("no probe for --device cpu")

    warning = cpu_warning("gpt2-124m", "cpu", probe=never)
    assert warning is not None and "(--device cpu)" in warning


def test_the_probe_reads_the_interpreters_answer(tmp_path: Path):
    # A stand-in interpreter that answers as a CUDA machine's would: no warning then.
    fake = tmp_path / "python-with-cuda"
    fake.write_text("#!/bin/sh\necho 1\n")
    fake.chmod(0o755)
    assert cuda_probe(str(fake)) == (True, f"torch.cuda.is_available() in {fake} is True")
    assert cpu_warning("gpt2-124m", "auto", probe=lambda: cuda_probe(str(fake))) is None
    broken = tmp_path / "python-without-torch"
    broken.write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n"
    )
    broken.chmod(0o755)
    cuda, why = cuda_probe(str(broken))
    assert cuda is None and why.endswith("failed: ModuleNotFoundError: No module named 'torch'")
