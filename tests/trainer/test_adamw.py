"""The reference trainer's AdamW against torch.optim.AdamW's single-tensor path
(foreach=False): the same parameters, gradients and learning rates give the same bits at
every step, moments included.

The two run the same operations in the same order: decoupled weight decay
(`param *= 1 - lr * wd`) before the moments, `exp_avg.lerp_`, `exp_avg_sq.mul_.addcmul_`,
then `param.addcdiv_(exp_avg, sqrt(exp_avg_sq) / sqrt(bc2) + eps, value=-lr / bc1)`. The
only differences are in Python scalars, and neither changes a bit: torch counts steps in a
float32 tensor (exact for integers up to 2**24) where ours counts in an int, and takes
`bc2 ** 0.5` where ours takes `math.sqrt(bc2)` (both correctly rounded on glibc)."""

from __future__ import annotations

import copy

import torch

from trainwarden.trainer.adamw import AdamW
from trainwarden.trainer.model import GPT
from trainwarden.trainer.presets import PRESETS
from trainwarden.trainer.schedule import lr_at
from trainwarden.trainer.startup import BETAS, EPS, build_optimizer

TINY = PRESETS["tiny"]
STEPS = 200


def torch_adamw(model: GPT) -> torch.optim.AdamW:
    """torch's AdamW with the groups and hyperparameters `build_optimizer` gives ours."""
    groups = [
        {
            "params": [p for p in model.parameters() if p.dim() >= 2],
            "weight_decay": TINY.weight_decay,
        },
        {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=TINY.max_lr, betas=BETAS, eps=EPS, foreach=False)


def test_the_reference_adamw_matches_torch_adamw_bit_for_bit_over_200_steps():
    torch.manual_seed(0)
    ours_model = GPT(TINY)
    theirs_model = copy.deepcopy(ours_model)
    ours = build_optimizer(ours_model, TINY, foreach=False)
    theirs = torch_adamw(theirs_model)
    assert isinstance(ours, AdamW) and ours.foreach is False
    assert [g["weight_decay"] for g in ours.param_groups] == [TINY.weight_decay, 0.0]
    initial = [p.detach().clone() for p in ours_model.parameters()]
    ours_params = list(ours_model.parameters())
    theirs_params = list(theirs_model.parameters())

    generator = torch.Generator().manual_seed(1)
    for step in range(1, STEPS + 1):
        # The trainer's own schedule: warmup, then cosine decay to min_lr at the end.
        lr = lr_at(step, TINY, STEPS)
        for optimizer in (ours, theirs):
            for group in optimizer.param_groups:
                group["lr"] = lr
        for index, (a, b) in enumerate(zip(ours_params, theirs_params, strict=True)):
            if (index + step) % 11 == 0:
                a.grad = b.grad = None  # no gradient this step: both skip the parameter
                continue
            # Scales from 1e-9 (where eps dominates the denominator) to 10.
            grad = torch.randn(a.shape, generator=generator) * 10.0 ** (index % 6 * 2 - 9)
            a.grad, b.grad = grad.clone(), grad.clone()
        ours.step()
        theirs.step()
        for name, a, b in zip(
            [n for n, _ in ours_model.named_parameters()], ours_params, theirs_params, strict=True
        ):
            assert torch.equal(a, b), f"step {step}: {name} differs by {(a - b).abs().max().item()}"

    for a, b in zip(ours_params, theirs_params, strict=True):
        mine, state = ours.state[a], theirs.state[b]
        assert mine.step == int(state["step"].item())
        assert torch.equal(mine.exp_avg, state["exp_avg"])
        assert torch.equal(mine.exp_avg_sq, state["exp_avg_sq"])
    # Trained, decayed and skipped: not a comparison of two untouched models.
    assert all(not torch.equal(p, q) for p, q in zip(ours_params, initial, strict=True))
    assert len({ours.state[p].step for p in ours_params}) > 1
