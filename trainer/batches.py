"""The batch for a step: a pure function of (seed, step, arm), so resume replays it exactly.

Nothing here carries state from one step to the next (no iterator, no shared RNG): the
offsets come from a generator seeded by a hash of the three, so step 5,001 of a resumed
run reads the same bytes as step 5,001 of a run that never stopped. Validation batches
are drawn the same way under their own hash, from the held-out bytes.
"""

from __future__ import annotations

import hashlib

import torch


def batch_seed(seed: int, step: int, arm: str, purpose: str = "batch") -> int:
    digest = hashlib.blake2b(f"{purpose}:{seed}:{step}:{arm}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def as_tokens(data: bytes) -> torch.Tensor:
    # bytearray: torch.frombuffer wants a writable buffer to share without a warning.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def batch_for(
    tokens: torch.Tensor, seed: int, step: int, arm: str, rows: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each `rows` x `seq_len` int64, targets shifted by one byte."""
    return _windows(tokens, batch_seed(seed, step, arm), rows, seq_len)


def validation_batch(
    held_out: torch.Tensor, seed: int, index: int, arm: str, rows: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation batch `index` of an arm, like batch_for but never a training batch's seed."""
    return _windows(held_out, batch_seed(seed, index, arm, "validation"), rows, seq_len)


def _windows(
    tokens: torch.Tensor, generator_seed: int, rows: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(generator_seed)
    starts = torch.randint(0, tokens.numel() - seq_len - 1, (rows, 1), generator=generator)
    window = tokens[starts + torch.arange(seq_len + 1)].long()
    return window[:, :-1], window[:, 1:]
