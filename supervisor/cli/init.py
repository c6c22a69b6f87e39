"""`trainwarden init`: a working config for the reference trainer."""

from __future__ import annotations

import sys
from pathlib import Path

from trainwarden.supervisor.config import CONFIG_NAME, load_config
from trainwarden.supervisor.errors import UsageError

TEMPLATE = """\
# trainwarden run configuration (reference: README.md, "Configuration").
[run]
name = {name}
log = "training.log"

[trainer]
# The trainer's argv; it runs with the run directory as its working directory.
command = [{python}, "-m", "trainwarden.trainer", "--run-dir", ".", "--preset", "{preset}", "--steps", "{steps}", "--save-every", "{save_every}", "--device", "{device}"]
stop_timeout_s = {stop_timeout}
total_steps = {steps}

[checkpoints]
dir = "checkpoints"
format = "andrea-bin"
keep_last = 3
pinned = []

[restart]
backoff_initial_s = 2.0
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


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(
    run_dir: Path,
    *,
    preset: str = "tiny",
    steps: int = 2000,
    save_every: int = 100,
    force: bool = False,
    device: str = "auto",
) -> Path:
    if steps < 1 or save_every < 1:
        raise UsageError("--steps and --save-every must be at least 1")
    path = run_dir / CONFIG_NAME
    if path.exists() and not force:
        raise UsageError(f"{path} already exists; pass --force to overwrite it")
    run_dir.mkdir(parents=True, exist_ok=True)
    big = preset == "gpt2-124m"
    text = TEMPLATE.format(
        name=_toml_str(run_dir.name or "run"),
        python=_toml_str(sys.executable),
        preset=preset,
        steps=steps,
        save_every=save_every,
        device=device,
        stop_timeout=300 if big else 60,
        stall=600 if big else 120,
        vocab=50257 if big else 256,
        attention="attention = { n_layer = 12, seq_len = 1024, d_model = 768 }" if big else "",
    )
    path.write_text(text, encoding="utf-8")
    load_config(run_dir)
    return path
