"""AdamW's multi-tensor (foreach) path against its per-parameter path: the same bits."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    # torch complains at import that NumPy is absent; nothing here needs NumPy.
    warnings.simplefilter("ignore")
    import torch

from trainwarden.trainer.adamw import AdamW
from trainwarden.trainer.model import GPT
from trainwarden.trainer.presets import PRESETS
from trainwarden.trainer.startup import BETAS, EPS, build_optimizer

STEPS = 200


def twin_optimizers() -> tuple[list[torch.nn.Parameter], AdamW, list[torch.nn.Parameter], AdamW]:
    """Two identical parameter sets (shapes of the tiny GPT), one optimizer per path."""
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    shapes = [p.shape for p in model.parameters()]
    initial = [torch.randn(shape) for shape in shapes]
    optimizers = []
    param_sets = []
    for foreach in (False, True):
        params = [torch.nn.Parameter(t.clone()) for t in initial]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        param_sets.append(params)
        optimizers.append(AdamW(groups, lr=3e-3, betas=BETAS, eps=EPS, foreach=foreach))
    return param_sets[0], optimizers[0], param_sets[1], optimizers[1]


def test_foreach_update_is_bit_identical_over_many_steps_with_uneven_step_counts():
    plain_params, plain, foreach_params, foreach = twin_optimizers()
    # Uneven per-parameter step counts, as a resume from such a checkpoint would bring.
    for index, (a, b) in enumerate(zip(plain_params, foreach_params, strict=True)):
        plain.state[a].step = foreach.state[b].step = index % 3
    generator = torch.Generator().manual_seed(1)
    for step in range(1, STEPS + 1):
        lr = 3e-3 * (0.5 + 0.5 * torch.rand((), generator=generator).item())
        for optimizer in (plain, foreach):
            for group in optimizer.param_groups:
                group["lr"] = lr
        for index, (a, b) in enumerate(zip(plain_params, foreach_params, strict=True)):
            if (index + step) % 7 == 0:
                # No gradient this step: this parameter's step count falls behind.
                a.grad = b.grad = None
                continue
            # Scales from 1e-9 (where eps matters) to 10.
            grad = torch.randn(a.shape, generator=generator) * 10 ** (index % 6 * 2 - 9)
            a.grad, b.grad = grad.clone(), grad.clone()
        plain.step()
        foreach.step()

    counts = set()
    for a, b in zip(plain_params, foreach_params, strict=True):
        mine, theirs = plain.state[a], foreach.state[b]
        assert mine.step == theirs.step
        counts.add(mine.step)
        assert torch.equal(a, b)
        assert torch.equal(mine.exp_avg, theirs.exp_avg)
        assert torch.equal(mine.exp_avg_sq, theirs.exp_avg_sq)
    assert len(counts) > 1, "the step counts should differ between parameters"
    assert not torch.equal(plain_params[0], twin_optimizers()[0][0]), "nothing was trained"


def test_start_up_uses_foreach_on_cuda_only_unless_asked():
    model = GPT(PRESETS["tiny"])
    assert build_optimizer(model, PRESETS["tiny"]).foreach is False
    assert build_optimizer(model, PRESETS["tiny"], foreach=True).foreach is True


def test_the_cuda_reciprocal_is_float32s_own_quotient():
    # On CUDA the foreach path multiplies by this reciprocal, as `tensor / scalar` does.
    from trainwarden.trainer.adamw import _float32

    generator = torch.Generator().manual_seed(2)
    for divisor in (torch.rand(500, generator=generator, dtype=torch.float64) + 1e-3).tolist():
        expected = torch.tensor(1.0) / torch.tensor(divisor, dtype=torch.float32)
        assert _float32(1.0 / _float32(divisor)) == expected.item()
