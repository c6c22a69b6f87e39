"""Model and batch shapes the trainer knows by name (no torch: the CLI checks names early)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    name: str
    n_layer: int
    n_head: int
    d_model: int
    seq_len: int
    """Tokens per sequence (context length)."""
    vocab_size: int
    batch_size: int
    """Sequences per micro-batch."""
    grad_accum: int
    """Micro-batches per optimisation step."""
    max_lr: float
    min_lr: float
    warmup_steps: int
    """Linear warmup length, capped at a tenth of the run's planned steps."""
    cpu_threads: int = 1
    """torch threads on a CPU (capped at the core count). Fixed per preset: matmul results
    depend on how work is split across threads, and exact resume needs the same split."""
    weight_decay: float = 0.1
    grad_clip: float = 1.0

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seq_len

    @property
    def n_params(self) -> int:
        """Parameters of trainer.model.GPT at this shape, known without building it (so
        a checkpoint of the wrong size is refused before torch is even imported)."""
        d = self.d_model
        # Per block: two LayerNorms (4d), qkv (3d^2 + 3d), proj (d^2 + d), MLP (8d^2 + 5d).
        per_block = 12 * d * d + 13 * d
        # Token and position embeddings, the blocks, the final LayerNorm; lm_head is tied.
        return self.vocab_size * d + self.seq_len * d + self.n_layer * per_block + 2 * d


PRESETS: dict[str, Preset] = {
    # Sized so 1,000 steps take well under a minute on two CPU cores. One thread: at
    # this size a second one gains little, and on a busy machine threads that wait for
    # each other at every op cost far more than they give.
    "tiny": Preset(
        name="tiny",
        n_layer=2,
        n_head=4,
        d_model=64,
        seq_len=64,
        vocab_size=256,
        batch_size=8,
        grad_accum=1,
        max_lr=3e-3,
        min_lr=3e-4,
        warmup_steps=20,
    ),
    # GPT-2 small. The data is bytes, but the vocabulary keeps GPT-2's size so the
    # parameter count and FLOPs match the real thing. 8 x 1024 tokens per micro-batch
    # fits a 24 GB card under bf16 autocast; 8 micro-batches make 64K tokens a step.
    "gpt2-124m": Preset(
        name="gpt2-124m",
        n_layer=12,
        n_head=12,
        d_model=768,
        seq_len=1024,
        vocab_size=50257,
        batch_size=8,
        grad_accum=8,
        max_lr=6e-4,
        min_lr=6e-5,
        warmup_steps=700,
        cpu_threads=8,
    ),
}
