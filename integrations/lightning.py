"""PyTorch Lightning under trainwarden: one callback and the resume path.

    from trainwarden.integrations.lightning import TrainwardenCallback, resume_ckpt_path

    trainer = pl.Trainer(..., callbacks=[TrainwardenCallback()])
    trainer.fit(model, ckpt_path=resume_ckpt_path())

Under the daemon (TRAINWARDEN_RUN_DIR set) the callback, from the `fit` stage's setup on:
- catches SIGUSR1 (save) and SIGTERM (save and stop); the handlers only set flags, acted on
  at the next optimisation step's end: a checkpoint through `Trainer.save_checkpoint`, and
  after SIGTERM `trainer.should_stop`, so `fit` returns and the script exits 0;
- saves every `every_n_steps` steps when asked to;
- prints one `step: N, loss: X, dt: S` line per optimisation step (the `step-line` parser),
  N being Lightning's own `global_step`, so steps stay exact across restarts.

A checkpoint is written by `trainer.save_checkpoint` to `step=NNNNNN.ckpt.tmp` in the run's
checkpoint folder, then fsynced and renamed to `step=NNNNNN.ckpt` (the commit), and the
folder fsynced: Lightning's own write is not durable (no fsync) and, from a temporary file
on another filesystem, not atomic either. Every rank calls `save_checkpoint` (a strategy that
shards the state needs them all; it ends in a barrier); global rank 0 writes, fsyncs and
renames. Under more than one process the flags are all-reduced at each step end
(`strategy.reduce_boolean_decision`), so every rank saves and stops at the same step.

Lightning installs its own SIGTERM handler when `fit` starts running (after `setup`): it
makes the loops raise `SIGTERMException` after the current batch, which ends `fit` with
an exception instead of a return. The callback takes SIGTERM back in `on_train_start`, and
restores what was there before `setup` at `teardown`. SIGUSR1 is Lightning's only under
SLURM auto-requeue and only when nothing else handles it: with this callback it is the
callback's.

Outside the daemon nothing is installed, printed or written: the callback does nothing.
Lightning (`lightning` or `pytorch_lightning`) is imported only when the callback is.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from trainwarden.integrations.loop import Requests, fsync_path, resume_path, under_daemon
from trainwarden.supervisor.contract import (
    ENV_RUN_DIR,
    TMP_SUFFIX,
    lightning_checkpoint_name,
)

INSTALL = "pip install 'trainwarden[lightning]'"
DEFAULT_DIRPATH = "checkpoints"
"""The checkpoint folder, relative to the run directory (the daemon's default)."""

__all__ = ["TrainwardenCallback", "resume_ckpt_path", "under_daemon"]

TrainwardenCallback: type
"""The Lightning callback class, built on first access (module `__getattr__`): it subclasses
the installed framework's `Callback`, so Lightning is imported only then."""


def resume_ckpt_path() -> str | None:
    """The checkpoint the daemon chose to resume from, for `trainer.fit(ckpt_path=...)`;
    None for a fresh start (and outside the daemon)."""
    return resume_path() if under_daemon() else None


def _framework() -> ModuleType:
    """`lightning.pytorch`, or `pytorch_lightning` when only that one is in use or installed."""
    if "pytorch_lightning" in sys.modules and "lightning.pytorch" not in sys.modules:
        order = ("pytorch_lightning", "lightning.pytorch")
    else:
        order = ("lightning.pytorch", "pytorch_lightning")
    for name in order:
        try:
            return __import__(name, fromlist=["Callback"])
        except ImportError:
            continue
    raise ImportError(
        f"trainwarden.integrations.lightning needs PyTorch Lightning: install it with `{INSTALL}`"
    )


def _loss_of(outputs: Any) -> float | None:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if loss is None:
        return None
    try:
        return float(loss.detach()) if hasattr(loss, "detach") else float(loss)
    except (TypeError, ValueError, RuntimeError):
        return None


Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def _callback_class() -> type:
    pl = _framework()

    class TrainwardenCallback(pl.Callback):  # type: ignore[misc,name-defined]
        """Saves on SIGUSR1, saves and stops on SIGTERM, saves every `every_n_steps` steps
        (None: only on request), and prints a step line per optimisation step, all under
        the daemon only. `dirpath`: the checkpoint folder, relative to the run directory."""

        def __init__(
            self,
            dirpath: str | os.PathLike[str] = DEFAULT_DIRPATH,
            every_n_steps: int | None = None,
        ) -> None:
            super().__init__()
            if every_n_steps is not None and (
                isinstance(every_n_steps, bool)
                or not isinstance(every_n_steps, int)
                or every_n_steps < 1
            ):
                raise ValueError(
                    f"every_n_steps = {every_n_steps!r}: expected None or an integer >= 1"
                )
            self.every_n_steps = every_n_steps
            self.active = under_daemon()
            self.dirpath = Path(os.environ.get(ENV_RUN_DIR, ".")) / dirpath
            self.requests = Requests()
            self.saved_step: int | None = None
            self._previous: dict[int, Handler] = {}
            self._step = 0
            self._losses: list[float] = []
            self._t = 0.0

        # ------------------------------------------------------------------ signals

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if not self.active or stage != "fit":
                return
            if trainer.is_global_zero:
                self.dirpath.mkdir(parents=True, exist_ok=True)
            if threading.current_thread() is threading.main_thread():
                for signum, handler in (
                    (signal.SIGUSR1, self.requests.on_sigusr1),
                    (signal.SIGTERM, self.requests.on_sigterm),
                ):
                    self._previous.setdefault(signum, signal.getsignal(signum))
                    signal.signal(signum, handler)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if not self.active:
                return
            # Lightning put its own SIGTERM handler in front of ours when fit began running;
            # it would end fit with SIGTERMException after the batch. Ours saves and stops.
            if signal.SIGTERM in self._previous:
                signal.signal(signal.SIGTERM, self.requests.on_sigterm)
            self._warn_of_model_checkpoints(trainer)
            self._step = trainer.global_step
            # A resumed run starts at the checkpoint's step: saving it again gains nothing.
            self.saved_step = trainer.global_step if trainer.global_step else None
            self._losses = []
            self._t = time.monotonic()

        def _warn_of_model_checkpoints(self, trainer: Any) -> None:
            if not trainer.is_global_zero:
                return
            for callback in trainer.checkpoint_callbacks:
                dirpath = getattr(callback, "dirpath", None)
                if dirpath is None or callback is self:
                    continue
                try:
                    same = Path(dirpath).resolve() == self.dirpath.resolve()
                except (OSError, TypeError, ValueError):
                    continue
                if same:
                    print(
                        f"trainwarden: {type(callback).__name__} writes into the daemon's "
                        f"checkpoint folder {self.dirpath}: its files are not fsynced, not "
                        "always renamed into place, and its save_top_k deletes behind the "
                        "daemon's retention; give it another dirpath or set "
                        "enable_checkpointing=False (TrainwardenCallback saves)",
                        file=sys.stderr,
                        flush=True,
                    )

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if threading.current_thread() is threading.main_thread():
                for signum, handler in self._previous.items():
                    signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            self._previous.clear()

        # ------------------------------------------------------------------ steps

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if not self.active:
                return
            loss = _loss_of(outputs)
            if loss is not None:
                self._losses.append(loss)
            step = trainer.global_step
            if step == self._step:
                return  # accumulating gradients: the optimisation step is not done yet
            self._step = step
            now = time.monotonic()
            if trainer.is_global_zero:
                self._print_step(trainer, pl_module, step, now - self._t)
            self._t = now
            self._losses = []
            periodic = self.every_n_steps is not None and step % self.every_n_steps == 0
            save, self.requests.save = self.requests.save, False
            stop = self.requests.stop
            if trainer.world_size > 1:
                save = trainer.strategy.reduce_boolean_decision(save, all=False)
                stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
            if periodic or save or stop:
                self.save(trainer, step)
            if stop:
                trainer.should_stop = True

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            # A request that came after the last step's end (or a stop at the last step)
            # still gets its checkpoint.
            if not self.active:
                return
            pending = self.requests.save or self.requests.stop
            if trainer.world_size > 1:
                pending = trainer.strategy.reduce_boolean_decision(pending, all=False)
            self.requests.save = False
            if pending and trainer.global_step and self.saved_step != trainer.global_step:
                self.save(trainer, trainer.global_step)

        def _print_step(self, trainer: Any, pl_module: Any, step: int, dt: float) -> None:
            losses = self._losses
            loss: float | None
            if losses and getattr(pl_module, "automatic_optimization", True):
                # Lightning hands each micro-batch's loss on divided by accumulate_grad_batches
                # (also in a step cut short by the epoch's end): the mean of what was returned.
                loss = sum(losses) * trainer.accumulate_grad_batches / len(losses)
            elif losses:
                loss = sum(losses) / len(losses)
            else:
                metric = trainer.callback_metrics.get(
                    "loss", trainer.callback_metrics.get("train_loss")
                )
                loss = _loss_of(metric) if metric is not None else None
            if loss is None:
                return  # nothing to report: training_step returned no loss and logged none
            text = repr(loss) if math.isfinite(loss) else str(loss)
            print(f"step: {step}, loss: {text}, dt: {dt:.6f}", flush=True)

        # ------------------------------------------------------------------ saving

        def save(self, trainer: Any, step: int) -> Path:
            """Write the checkpoint of `step` through Lightning and commit it; every rank
            calls this."""
            final = self.dirpath / lightning_checkpoint_name(step)
            tmp = final.with_name(final.name + TMP_SUFFIX)
            trainer.save_checkpoint(str(tmp), weights_only=False)
            if trainer.is_global_zero:
                fsync_path(tmp)
                os.replace(tmp, final)
                # The rename is not durable until the folder is fsynced.
                fsync_path(self.dirpath)
            trainer.strategy.barrier("trainwarden_commit")
            self.saved_step = step
            return final

    # Pickled by name (ddp_spawn sends the trainer's callbacks to its workers): the module's
    # __getattr__ hands this same class back.
    TrainwardenCallback.__qualname__ = "TrainwardenCallback"
    TrainwardenCallback.__module__ = __name__
    return TrainwardenCallback


_built: type | None = None


def __getattr__(name: str) -> Any:
    global _built
    if name == "TrainwardenCallback":
        if _built is None:
            _built = _callback_class()
        return _built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
