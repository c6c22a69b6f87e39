"""AdamW (decoupled weight decay) with plain integer step counts per parameter.

Same update as torch.optim.AdamW's single-tensor path. It is written out because
constructing any torch.optim optimizer imports torch._dynamo, two seconds of every
start-up on a small machine, and the supervisor restarts the trainer often. Having the
state in plain view also keeps the checkpoint mapping obvious: m, v and step per
parameter, nothing else.

Two paths compute the same update bit for bit: one parameter at a time, and `foreach`,
which runs each operation over a list of tensors at once (torch._foreach_*: a few
multi-tensor kernel launches on CUDA instead of eight per parameter). Same operations in
the same order with the same scalars; parameters are batched by their step count, since
the bias corrections depend on it.
"""

from __future__ import annotations

import math
import struct
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class ParamState:
    step: int
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor


class AdamW:
    def __init__(
        self,
        groups: Iterable[dict[str, Any]],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        foreach: bool = False,
    ) -> None:
        self.betas = betas
        self.eps = eps
        self.foreach = foreach
        self.param_groups = [
            {"params": list(g["params"]), "weight_decay": g["weight_decay"], "lr": lr}
            for g in groups
        ]
        self.state: dict[nn.Parameter, ParamState] = {}
        for group in self.param_groups:
            for param in group["params"]:
                self.state[param] = ParamState(0, torch.zeros_like(param), torch.zeros_like(param))

    def zero_grad(self) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        if self.foreach:
            self._step_foreach()
        else:
            self._step_per_parameter()

    def _step_per_parameter(self) -> None:
        beta1, beta2 = self.betas
        for group in self.param_groups:
            lr, weight_decay = group["lr"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                state.step += 1
                param.mul_(1 - lr * weight_decay)
                state.exp_avg.lerp_(param.grad, 1 - beta1)
                state.exp_avg_sq.mul_(beta2).addcmul_(param.grad, param.grad, value=1 - beta2)
                bias_correction1 = 1 - beta1**state.step
                bias_correction2_sqrt = math.sqrt(1 - beta2**state.step)
                denom = (state.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
                param.addcdiv_(state.exp_avg, denom, value=-lr / bias_correction1)

    def _step_foreach(self) -> None:
        beta1, beta2 = self.betas
        for group in self.param_groups:
            lr, weight_decay = group["lr"], group["weight_decay"]
            by_step: defaultdict[int, list[nn.Parameter]] = defaultdict(list)
            for param in group["params"]:
                if param.grad is not None:
                    by_step[self.state[param].step + 1].append(param)
            for step, batch in by_step.items():
                states = [self.state[param] for param in batch]
                for state in states:
                    state.step = step
                params: list[torch.Tensor] = list(batch)
                grads = [param.grad for param in batch if param.grad is not None]
                exp_avgs = [state.exp_avg for state in states]
                exp_avg_sqs = [state.exp_avg_sq for state in states]
                torch._foreach_mul_(params, 1 - lr * weight_decay)
                torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
                torch._foreach_mul_(exp_avg_sqs, beta2)
                torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
                bias_correction1 = 1 - beta1**step
                bias_correction2_sqrt = math.sqrt(1 - beta2**step)
                denoms = torch._foreach_sqrt(exp_avg_sqs)
                _divide_by_scalar(denoms, bias_correction2_sqrt)
                torch._foreach_add_(denoms, self.eps)
                torch._foreach_addcdiv_(params, exp_avgs, denoms, value=-lr / bias_correction1)


def _divide_by_scalar(
    tensors: tuple[torch.Tensor, ...] | list[torch.Tensor], divisor: float
) -> None:
    """`tensor / divisor` for each tensor, rounded as the per-parameter path rounds it.

    On CUDA, `tensor / python_float` multiplies by the float32 reciprocal (one bit less
    exact than dividing), but the multi-tensor `_foreach_div_` really divides: mirror the
    single-tensor kernel there. On the CPU both divide, and _foreach_div_ is the same op.
    """
    if tensors and tensors[0].device.type == "cuda":
        torch._foreach_mul_(tensors, _float32(1.0 / _float32(divisor)))
    else:
        torch._foreach_div_(tensors, divisor)


def _float32(value: float) -> float:
    """The nearest float32 to `value` (a double divides two float32s exactly enough that
    rounding its quotient once more gives float32's own quotient)."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])
