"""The batch for a step: a pure function of (seed, data step, arm), so resume replays it
exactly.

Nothing here carries state from one step to the next (no iterator, no shared RNG): the
offsets come from a generator seeded by a hash of the three, so step 5,001 of a resumed
run reads the same bytes as step 5,001 of a run that never stopped. The data step is the
step itself unless windows of data were skipped after a loss spike
(`contract.data_step`): then the skipped windows are part of the key. Validation batches
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


def garbage_targets(seed: int, step: int, arm: str, shape: torch.Size) -> torch.Tensor:
    """Uniformly random next bytes for a bad-data batch, a pure function like the batch.

    No model can average below ln 256 = 5.55 nats a byte on them, and a trained one starts
    far above it (it is confident about the real next byte), so the loss stays up for as
    long as the bad data lasts, whatever the model has learned.
    """
    digest = hashlib.blake2b(f"garbage:{seed}:{step}:{arm}".encode(), digest_size=8).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))
    return torch.randint(0, 256, shape, generator=generator)


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
