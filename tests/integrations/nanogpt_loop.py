"""A nanoGPT-style hand-written training loop that uses trainwarden.integrations.loop.

    python tests/integrations/nanogpt_loop.py --max-iters N [--save-every K] [--sleep S]
        [--out-dir DIR] [--record-dir DIR] [--slow-save-at ITER] [--seed SEED]
    torchrun --standalone --nproc-per-node=2 tests/integrations/nanogpt_loop.py ...

As nanoGPT's train.py: a tiny byte-level language model, AdamW, the batch of iteration i
drawn from a generator seeded by i (so a resumed run sees the data it would have seen),
`iter N: loss X, time Yms, mfu -100.00%` lines from rank 0, and a checkpoint holding
`iter_num` = the next iteration to run, saved at the end of an iteration. Under torchrun
(RANK set) it trains with DDP over gloo and reads the flags with `Signals(sync=True)`.

--record-dir: each rank appends `save ITER` / `stop ITER` to rank<R>.log when it sees a
request, and writes its pid to rank<R>.pid. --slow-save-at: the save of that iteration
holds its `.tmp` for two seconds before the fsync (a window to kill it in).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from trainwarden.integrations.loop import Signals, atomic_torch_save, resume_path

TEXT = (
    b"It is a truth universally acknowledged, that a single man in possession of a good "
    b"fortune, must be in want of a wife. However little known the feelings or views of "
    b"such a man may be on his first entering a neighbourhood, this truth is so well fixed."
)
BLOCK = 16
BATCH = 8
SLOW_SAVE_S = 2.0


class TinyLM(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, 256)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(idx))))


def get_batch(data: torch.Tensor, seed: int, iter_num: int, rank: int, world: int):
    generator = torch.Generator().manual_seed(seed * 1_000_003 + iter_num * world + rank)
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,), generator=generator)
    x = torch.stack([data[i : i + BLOCK] for i in ix.tolist()])
    y = torch.stack([data[i + 1 : i + 1 + BLOCK] for i in ix.tolist()])
    return x, y


@contextlib.contextmanager
def slow_fsync(seconds: float) -> Iterator[None]:
    real = os.fsync

    def slow(fd: int) -> None:
        time.sleep(seconds)
        real(fd)

    os.fsync = slow
    try:
        yield
    finally:
        os.fsync = real


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-iters", type=int, required=True)
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--out-dir", default="checkpoints")
    parser.add_argument("--record-dir", default=None)
    parser.add_argument("--slow-save-at", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()

    # Installed before anything slow, so the daemon sees the handlers from the start.
    ddp = int(os.environ.get("RANK", -1)) != -1
    signals = Signals(sync=ddp)
    torch.set_num_threads(1)
    rank, world = 0, 1
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    master = rank == 0
    out_dir = Path(args.out_dir)
    if master:
        out_dir.mkdir(parents=True, exist_ok=True)
    record = Path(args.record_dir) / f"rank{rank}.log" if args.record_dir else None
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.with_suffix(".pid").write_text(str(os.getpid()))

    torch.manual_seed(args.seed)
    data = torch.tensor(list(TEXT), dtype=torch.long)
    raw_model = TinyLM()
    optimizer = torch.optim.AdamW(raw_model.parameters(), lr=3e-3, weight_decay=0.1)
    iter_num = 0
    resume = resume_path()
    if resume:
        checkpoint = torch.load(resume, map_location="cpu", weights_only=True)
        raw_model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num = checkpoint["iter_num"]
    model: nn.Module = DistributedDataParallel(raw_model) if ddp else raw_model
    if master:
        print(f"nanogpt loop: world {world}, from iter {iter_num}", flush=True)

    while iter_num < args.max_iters:
        t0 = time.time()
        x, y = get_batch(data, args.seed, iter_num, rank, world)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        time.sleep(args.sleep)
        if master:
            dt = time.time() - t0
            print(f"iter {iter_num}: loss {loss.item():.6f}, time {dt * 1000:.2f}ms, mfu -100.00%")
        iter_num += 1

        save, stop = signals.save_requested, signals.stop_requested
        if record is not None and (save or stop):
            with open(record, "a") as f:
                f.write(
                    "".join(
                        f"{what} {iter_num}\n"
                        for what, on in (("save", save), ("stop", stop))
                        if on
                    )
                )
        periodic = args.save_every > 0 and iter_num % args.save_every == 0
        if save or stop or periodic or iter_num == args.max_iters:
            if master:
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iter_num": iter_num,
                }
                slow = args.slow_save_at == iter_num
                with slow_fsync(SLOW_SAVE_S) if slow else contextlib.nullcontext():
                    atomic_torch_save(checkpoint, out_dir / f"ckpt_{iter_num:06d}.pt")
            signals.saved()
        if stop:
            break

    if ddp:
        dist.barrier()
        dist.destroy_process_group()
        # On the CPU with gloo, torch can still abort in the interpreter's finalization
        # (SIGABRT from a gloo thread's leftover work) after all of the above: end here.
        sys.stdout.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
