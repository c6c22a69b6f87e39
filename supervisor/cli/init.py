"""`trainwarden init`: a working config for the reference trainer."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from trainwarden.supervisor.cli.start_checks import load_for_start
from trainwarden.supervisor.config import CONFIG_NAME
from trainwarden.supervisor.config_toml import toml_value
from trainwarden.supervisor.errors import UsageError

GPU_PRESETS = frozenset({"gpt2-124m"})
"""Presets that only train at a useful speed on a CUDA GPU."""
CUDA_PROBE = "import torch; print(int(torch.cuda.is_available()))"
CUDA_PROBE_TIMEOUT_S = 120.0

TEMPLATE = """\
{header}# trainwarden run configuration (reference: docs/configuration.md).
[run]
name = {name}
log = "training.log"

[trainer]
# The trainer's argv; it runs with the run directory as its working directory.
command = [{python}, "-m", "trainwarden.trainer", "--run-dir", ".", "--preset", {preset}, "--steps", "{steps}", "--save-every", "{save_every}", "--device", {device}{extra_args}]
stop_timeout_s = {stop_timeout}
{total_steps}
# The reference trainer skips data and scales its learning rate on a spike rollback.
supports = ["skip_data", "lr_scale"]

[checkpoints]
dir = "checkpoints"
format = "andrea-bin"
keep_last = 3
pinned = []

[restart]
backoff_initial_s = {backoff}
backoff_max_s = 300.0
max_restarts_without_progress = 5
stall_timeout_s = {stall}
divergence_retries = 1

[telemetry]
parser = "step-line"
n_params = "auto"
peak_tflops = "auto"
vocab_size = {vocab}
{attention}
"""


def write_config(
    run_dir: Path,
    *,
    preset: str = "tiny",
    steps: int = 2000,
    save_every: int = 100,
    force: bool = False,
    device: str = "auto",
    extra_args: Sequence[str] = (),
    stall_timeout_s: float | None = None,
    stop_timeout_s: float | None = None,
    backoff_initial_s: float = 2.0,
    header: str = "",
    endless: bool = False,
) -> Path:
    """Write RUN/trainwarden.toml; `extra_args` go to the trainer's command line and
    `header` (comment lines) above the config. `endless`: a run that trains until stopped
    (the trainer's `--steps` only far off), so [trainer] names no total_steps and status and
    the TUI show no percentage and no ETA."""
    if steps < 1 or save_every < 1:
        raise UsageError("--steps and --save-every must be at least 1")
    path = run_dir / CONFIG_NAME
    if path.exists() and not force:
        raise UsageError(f"{path} already exists; pass --force to overwrite it")
    run_dir.mkdir(parents=True, exist_ok=True)
    big = preset == "gpt2-124m"
    text = TEMPLATE.format(
        name=toml_value(run_dir.name or "run"),
        python=toml_value(sys.executable),
        preset=toml_value(preset),
        steps=steps,
        total_steps=(
            "# No total_steps: the run trains until stopped (no percentage, no ETA)."
            if endless
            else f"total_steps = {steps}"
        ),
        save_every=save_every,
        device=toml_value(device),
        header=header,
        extra_args="".join(f", {toml_value(arg)}" for arg in extra_args),
        backoff=repr(float(backoff_initial_s)),
        stop_timeout=f"{stop_timeout_s:g}" if stop_timeout_s is not None else 300 if big else 60,
        stall=f"{stall_timeout_s:g}" if stall_timeout_s is not None else 600 if big else 120,
        vocab=50257 if big else 256,
        attention="attention = { n_layer = 12, seq_len = 1024, d_model = 768 }" if big else "",
    )
    path.write_text(text, encoding="utf-8")
    load_for_start(run_dir)
    return path


def cuda_probe(python: str = sys.executable) -> tuple[bool | None, str]:
    """Whether torch sees a CUDA device in `python` (the trainer's interpreter), asked in a
    child process so that this one never imports torch; (None, why) when it cannot tell."""
    what = f"torch.cuda.is_available() in {python}"
    try:
        result = subprocess.run(
            [python, "-c", CUDA_PROBE],
            capture_output=True,
            text=True,
            timeout=CUDA_PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{what} could not be asked ({exc})"
    answer = result.stdout.strip().splitlines()[-1:] if result.returncode == 0 else []
    if answer == ["1"]:
        return True, f"{what} is True"
    if answer == ["0"]:
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        env = f" (CUDA_VISIBLE_DEVICES={hidden!r})" if hidden is not None else ""
        return False, f"{what} is False{env}"
    last = (result.stderr.strip().splitlines() or ["no output"])[-1]
    return None, f"{what} failed: {last[:160]}"


def cpu_warning(
    preset: str, device: str, probe: Callable[[], tuple[bool | None, str]] = cuda_probe
) -> str | None:
    """One line when `preset` will train on a CPU (or not at all), else None."""
    if preset not in GPU_PRESETS:
        return None
    if device == "cpu":
        checked = "--device cpu"
    else:
        cuda, checked = probe()
        if cuda:
            return None
    return (
        f"warning: --preset {preset} will not be practical on CPU ({checked}); "
        "for a run on this machine use --preset tiny"
    )
