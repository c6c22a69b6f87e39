"""A hand-written training loop that trainwarden can supervise.

It prints one line per step, writes step-named checkpoints atomically, saves on
SIGUSR1, saves and exits on SIGTERM, and resumes from the checkpoint the daemon names.
"""

import time
from pathlib import Path

import torch

from trainwarden.integrations.loop import Signals, atomic_torch_save, resume_path

TOTAL_STEPS = 2000
SAVE_EVERY = 100
CHECKPOINTS = Path("checkpoints")

signals = Signals()  # before the first step: the daemon checks the handlers are there
torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
target = torch.randn(16, 1) / 4  # a loss of about 1 at the start, far below max_loss

step = 0
if resume_path():  # None on a fresh start
    state = torch.load(resume_path(), weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = state["step"]


def save(step: int) -> None:
    CHECKPOINTS.mkdir(exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    atomic_torch_save(state, CHECKPOINTS / f"ckpt_{step:06d}.pt")
    signals.saved()


while step < TOTAL_STEPS:
    started = time.perf_counter()
    # The batch is a function of the step, so a resumed run sees the data it would have.
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
    loss = torch.nn.functional.mse_loss(model(x), x @ target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.02)  # stands in for a real model's step, so there is time to watch
    step += 1
    print(f"step: {step}, loss: {loss.item():.4f}, dt: {time.perf_counter() - started:.4f}")
    if step % SAVE_EVERY == 0 or signals.save_requested or signals.stop_requested:
        save(step)
    if signals.stop_requested:
        break
