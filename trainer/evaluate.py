"""Validation loss on the held-out split of every arm, on the same batches every time.

Batch i of an arm is a pure function of (seed, arm, i) over the arm's held-out bytes, so
figures are comparable across steps, resumes and branches of a run. Forward passes run
under no_grad and draw from a private generator: the training RNG, the optimizer and the
data order are untouched, so a run that evaluates trains bit-identically to one that
does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainwarden.trainer.batches import as_tokens, validation_batch
from trainwarden.trainer.corpus import Arm
from trainwarden.trainer.model import GPT
from trainwarden.trainer.presets import Preset

BATCHES_PER_ARM = 4
"""Batches of `preset.batch_size` rows per arm: a few forward passes, far less than the
save they precede, and enough to average out which windows were drawn."""


@dataclass(frozen=True)
class Validation:
    step: int
    loss: float
    """Mean over arms (each arm has the same number of batches)."""
    per_arm: dict[str, float]

    def line(self) -> str:
        """`eval: step N, val_loss X, val_docs: Y, ...`, what the step-line parser reads."""
        arms = "".join(f", val_{name}: {loss:.6f}" for name, loss in self.per_arm.items())
        return f"eval: step {self.step}, val_loss {self.loss:.6f}{arms}"


class Evaluator:
    """Holds each arm's validation batches, drawn once: every evaluation reuses them."""

    def __init__(
        self,
        arms: Mapping[str, Arm],
        seed: int,
        preset: Preset,
        device: torch.device,
        autocast: Callable[[], AbstractContextManager],
    ) -> None:
        self.device = device
        self.autocast = autocast
        self.batches = {}
        for name, arm in arms.items():
            held_out = as_tokens(arm.held_out)
            self.batches[name] = [
                validation_batch(held_out, seed, i, name, preset.batch_size, preset.seq_len)
                for i in range(BATCHES_PER_ARM)
            ]

    @torch.no_grad()
    def evaluate(self, model: GPT, step: int) -> Validation:
        was_training = model.training
        model.eval()
        try:
            per_arm = {
                name: self._arm_loss(model, batches) for name, batches in self.batches.items()
            }
        finally:
            model.train(was_training)
        return Validation(step, sum(per_arm.values()) / len(per_arm), per_arm)

    def _arm_loss(self, model: GPT, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        losses = []
        for inputs, targets in batches:
            x = inputs.to(self.device, non_blocking=True)
            y = targets.to(self.device, non_blocking=True)
            with self.autocast():
                logits = model(x)
                losses.append(F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1)))
        return torch.stack(losses).float().mean().item()
