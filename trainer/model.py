"""A GPT-2-shaped decoder: pre-norm blocks, causal attention, tied embeddings, no dropout.

No dropout keeps every step a pure function of (weights, optimizer state, batch), which
is what makes resume bit-exact. Parameters stay float32 (the checkpoint's master
precision); bf16 only ever appears inside autocast.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainwarden.trainer.presets import Preset


class CausalSelfAttention(nn.Module):
    def __init__(self, preset: Preset) -> None:
        super().__init__()
        self.n_head = preset.n_head
        self.qkv = nn.Linear(preset.d_model, 3 * preset.d_model)
        self.proj = nn.Linear(preset.d_model, preset.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        q, k, v = (t.view(batch, time, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, time, channels))


class Block(nn.Module):
    def __init__(self, preset: Preset) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(preset.d_model)
        self.attn = CausalSelfAttention(preset)
        self.ln_2 = nn.LayerNorm(preset.d_model)
        self.fc = nn.Linear(preset.d_model, 4 * preset.d_model)
        self.fc_proj = nn.Linear(4 * preset.d_model, preset.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, preset: Preset) -> None:
        super().__init__()
        self.preset = preset
        self.wte = nn.Embedding(preset.vocab_size, preset.d_model)
        self.wpe = nn.Embedding(preset.seq_len, preset.d_model)
        self.blocks = nn.ModuleList(Block(preset) for _ in range(preset.n_layer))
        self.ln_f = nn.LayerNorm(preset.d_model)
        self.lm_head = nn.Linear(preset.d_model, preset.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init for the projections that write into the residual stream.
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * preset.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))
