"""AdamW (decoupled weight decay) with plain integer step counts per parameter.

Same update as torch.optim.AdamW's single-tensor path. It is written out because
constructing any torch.optim optimizer imports torch._dynamo, two seconds of every
start-up on a small machine, and the supervisor restarts the trainer often. Having the
state in plain view also keeps the checkpoint mapping obvious: m, v and step per
parameter, nothing else.
"""

from __future__ import annotations

import math
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
    ) -> None:
        self.betas = betas
        self.eps = eps
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
