"""Short greedy samples per arm, kept in `RUN/.samples.json` for the operator to audit.

Greedy decoding under no_grad touches no RNG and no optimizer state, so sampling never
changes what training computes; a run with samples every step and one without end with
the same weights.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from trainwarden.supervisor.contract import SAMPLES_FILE
from trainwarden.trainer.atomic import write_json_atomically
from trainwarden.trainer.corpus import Arm
from trainwarden.trainer.model import GPT

SAMPLES_KEPT = 20
PROMPT_BYTES = 24
SAMPLE_BYTES = 64
BYTE_VOCAB = 256


def prompt_for(arm: Arm, step: int) -> bytes:
    """A prompt from a reproducible place in the arm, starting at a line when one is near."""
    digest = hashlib.blake2b(f"prompt:{step}:{arm.name}".encode(), digest_size=8).digest()
    start = int.from_bytes(digest, "little") % (len(arm.data) - 4096)
    newline = arm.data.find(b"\n", start, start + 512)
    if newline >= 0:
        start = newline + 1
    return arm.data[start : start + PROMPT_BYTES]


@torch.no_grad()
def generate(
    model: GPT,
    prompts: list[bytes],
    device: torch.device,
    autocast: Callable[[], AbstractContextManager],
) -> list[bytes]:
    """Greedy continuations of equal-length prompts, one batch row per prompt."""
    tokens = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=device)
    context = model.preset.seq_len
    for _ in range(SAMPLE_BYTES):
        with autocast():
            logits = model(tokens[:, -context:])
        # The vocabulary may be larger than a byte (gpt2-124m); only bytes are text here.
        next_tokens = logits[:, -1, :BYTE_VOCAB].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, next_tokens], dim=1)
    return [bytes(row[len(prompts[0]) :].tolist()) for row in tokens.cpu()]


def read_samples(path: Path) -> list[dict[str, Any]]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        samples = document["samples"]
    except (OSError, ValueError, KeyError, TypeError):
        # Missing or damaged: samples are an audit aid, never worth failing a run for.
        return []
    return samples if isinstance(samples, list) else []


def record_samples(
    run_dir: Path,
    step: int,
    model: GPT,
    arms: Mapping[str, Arm],
    device: torch.device,
    autocast: Callable[[], AbstractContextManager],
    now: float,
) -> None:
    prompts = {name: prompt_for(arm, step) for name, arm in arms.items()}
    continuations = generate(model, list(prompts.values()), device, autocast)
    path = run_dir / SAMPLES_FILE
    samples = read_samples(path)
    for (name, prompt), continuation in zip(prompts.items(), continuations, strict=True):
        samples.append(
            {
                "step": step,
                "arm": name,
                "prompt": prompt.decode("utf-8", errors="replace"),
                "text": continuation.decode("utf-8", errors="replace"),
                "t": now,
            }
        )
    write_json_atomically(path, {"samples": samples[-SAMPLES_KEPT:]})
