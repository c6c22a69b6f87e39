"""The step loop: train, log, save on schedule or on request, and stop cleanly.

Order within a step boundary matters to the supervisor: the step line is printed (and
flushed) before that step's checkpoint is written, so a checkpoint never names a step
the log has not shown.
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainwarden.supervisor.contract import BANDIT_STATE_FILE, checkpoint_name, data_step
from trainwarden.trainer.atomic import write_json_atomically
from trainwarden.trainer.batches import batch_for, garbage_targets
from trainwarden.trainer.checkpoint import param_step_counts
from trainwarden.trainer.evaluate import Evaluator
from trainwarden.trainer.faults import Faults
from trainwarden.trainer.samples import record_samples
from trainwarden.trainer.saving import CheckpointSaver, SaveDone
from trainwarden.trainer.schedule import lr_at, warmup_steps
from trainwarden.trainer.signals import SignalFlags
from trainwarden.trainer.skips import SIDECAR_LR_SCALE_KEY, SIDECAR_SKIP_KEY
from trainwarden.trainer.startup import BETAS, EPS, Session

STATE_FILE = BANDIT_STATE_FILE
STATE_EVERY = 10
"""Steps between .state.json updates (also written at every checkpoint)."""
STEP_SLEEP_ENV = "TRAINER_TEST_STEP_SLEEP_S"
"""Test-only: seconds to sleep after each step, so a test can signal at a chosen step."""


def say(line: str) -> None:
    print(line, flush=True)


class TrainingLoop:
    def __init__(self, session: Session, flags: SignalFlags) -> None:
        self.session = session
        self.flags = flags
        options = session.plan.options
        self.run_dir = options.run_dir
        self.checkpoint_dir = options.run_dir / "checkpoints"
        self.faults = Faults(
            options.run_dir,
            options.crash_at_step,
            options.nan_at_step,
            options.hang_at_step,
            options.bad_data_at_step,
            options.bad_data_steps,
        )
        self.step = session.start_step
        # A resumed run starts on a committed checkpoint: no need to write it again.
        self.saved_step: int | None = session.start_step if session.resumed_from else None
        self.saver = CheckpointSaver(
            self.checkpoint_dir,
            session.model,
            session.optimizer,
            session.device,
            background=not options.sync_save,
        )
        self.step_sleep_s = float(os.environ.get(STEP_SLEEP_ENV, "0") or 0)
        self.evaluator = (
            Evaluator(session.arms, options.seed, session.preset, session.device, session.autocast)
            if options.eval_every
            else None
        )

    # -- one optimisation step ------------------------------------------------------

    def lr(self, step: int) -> float:
        s = self.session
        return lr_at(step, s.preset, s.plan.options.steps) * s.plan.lr_scale

    def train_step(self, step: int) -> tuple[float, str, float]:
        """Run global step `step`; returns (loss, arm, lr)."""
        s = self.session
        preset = s.preset
        seed = s.plan.options.seed
        position = data_step(step, s.plan.skip_windows) - s.data_offset
        # The arm draw is data too: a skipped window skips its draws with its batches,
        # as skipping batches of a mixing data loader advances its sampler.
        arm = s.bandit.choose(position)
        inputs, targets = batch_for(
            s.tokens[arm],
            seed,
            position,
            arm,
            preset.batch_size * preset.grad_accum,
            preset.seq_len,
        )
        if self.faults.bad_data(position):
            targets = garbage_targets(seed, position, arm, targets.shape)
        inputs, targets = self.on_device(inputs), self.on_device(targets)
        lr = self.lr(step)
        for group in s.optimizer.param_groups:
            group["lr"] = lr
        poison = self.faults.nan_fires(step)
        s.optimizer.zero_grad()
        total = torch.zeros((), device=s.device)
        for micro in range(preset.grad_accum):
            rows = slice(micro * preset.batch_size, (micro + 1) * preset.batch_size)
            x, y = inputs[rows], targets[rows]
            with s.autocast():
                logits = s.forward(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
            loss = loss / preset.grad_accum
            if poison:
                # Injected divergence: NaN gradients poison weights and moments alike.
                loss = loss * float("nan")
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(s.model.parameters(), preset.grad_clip)
        s.optimizer.step()
        loss_value = total.item()
        s.bandit.update(arm, loss_value)
        s.tokens_seen += preset.tokens_per_step
        return loss_value, arm, lr

    def on_device(self, batch: torch.Tensor) -> torch.Tensor:
        """The step's whole batch on the training device, in one copy.

        From page-locked memory on CUDA, so the copy is really asynchronous: nothing in a
        step waits for the GPU but the loss read at its end (clip_grad_norm_ and the
        optimizer keep their figures on the device).
        """
        device = self.session.device
        if device.type != "cuda":
            return batch
        return batch.contiguous().pin_memory().to(device, non_blocking=True)

    # -- files ----------------------------------------------------------------------

    def sidecar(self) -> dict[str, Any]:
        s = self.session
        preset = s.preset
        return {
            "format": "andrea-bin",
            "step": self.step,
            "n_params": s.n_params,
            "preset": preset.name,
            "model": {
                "n_layer": preset.n_layer,
                "n_head": preset.n_head,
                "d_model": preset.d_model,
                "vocab_size": preset.vocab_size,
            },
            "seq_len": preset.seq_len,
            "batch_size": preset.batch_size,
            "grad_accum": preset.grad_accum,
            "tokens_per_step": preset.tokens_per_step,
            "seed": s.plan.options.seed,
            "total_steps": s.plan.options.steps,
            "data_fingerprint": s.plan.fingerprint,
            "data_offset": s.data_offset,
            "tokens_seen": s.tokens_seen,
            SIDECAR_SKIP_KEY: [list(window) for window in s.plan.skip_windows],
            SIDECAR_LR_SCALE_KEY: s.plan.lr_scale,
            "optimizer": {
                "name": "AdamW",
                "betas": list(BETAS),
                "eps": EPS,
                "weight_decay": preset.weight_decay,
                "step_counts": param_step_counts(s.model, s.optimizer),
            },
            "schedule": {
                "kind": "warmup-cosine",
                "step": self.step,
                "lr": self.lr(max(self.step, 1)),
                "warmup_steps": warmup_steps(preset, s.plan.options.steps),
                "max_lr": preset.max_lr,
                "min_lr": preset.min_lr,
                "total_steps": s.plan.options.steps,
            },
            "bandit": s.bandit.to_state(),
            "rng": {"torch_cpu": base64.b64encode(bytes(torch.get_rng_state().tolist())).decode()},
            "saved_at": time.time(),
        }

    def checkpoint_path(self) -> Path:
        return self.checkpoint_dir / checkpoint_name(self.step)

    def save(self, reason: str) -> None:
        started = time.perf_counter()
        # At most one write in flight: a save waits for the one before it (a stall it reports).
        self.report(self.saver.wait())
        if self.saved_step == self.step and self.checkpoint_path().exists():
            say(f"checkpoint: {self.checkpoint_path().name} already saved at step {self.step}")
            return
        self.report(self.saver.save(self.step, self.sidecar(), reason, started))
        self.saved_step = self.step
        self.write_state()

    def report(self, done: SaveDone | None) -> None:
        if done is not None:
            say(done.line())

    def write_state(self) -> None:
        document = self.session.bandit.state_document(self.step, time.time())
        write_json_atomically(self.run_dir / STATE_FILE, document)

    # -- the loop -------------------------------------------------------------------

    def at_boundary(self) -> bool:
        """Act on signal flags between steps; True means stop now."""
        if self.flags.stop_requested:
            self.save("stop requested")
            self.report(self.saver.wait())
            say(f"trainer: stopped on request at step {self.step}")
            return True
        if self.flags.save_requested:
            self.flags.save_requested = False
            self.save("save requested")
        return False

    def run(self) -> int:
        try:
            return self._run()
        except BaseException:
            # The snapshot in flight was taken at a clean boundary: commit it on the way out.
            try:
                self.report(self.saver.wait())
            except Exception as exc:
                say(f"trainer: the checkpoint write in flight failed too: {exc}")
            raise

    def _run(self) -> int:
        s = self.session
        options = s.plan.options
        self.run_dir.mkdir(parents=True, exist_ok=True)
        total_steps = options.steps
        if self.step >= total_steps:
            say(f"trainer: step {self.step} already reaches --steps {total_steps}; nothing to do")
            return 0
        self.write_state()
        for step in range(self.step + 1, total_steps + 1):
            if self.at_boundary():
                return 0
            started = time.perf_counter()
            loss, arm, lr = self.train_step(step)
            self.step = step
            dt = time.perf_counter() - started
            say(
                f"step: {step}, loss: {loss:.6f}, dt: {dt:.4f}, lr: {lr:.6f}, arm: {arm}, "
                f"tokens: {s.preset.tokens_per_step}"
            )
            self.faults.after_step_logged(step)
            self.report(self.saver.poll())
            # Before the step's checkpoint, like its step line. A resumed run starts after
            # its checkpoint, whose evaluation the log already holds: none is repeated.
            if self.evaluator is not None and (
                step % options.eval_every == 0 or step == total_steps
            ):
                say(self.evaluator.evaluate(s.model, step).line())
            if step % options.save_every == 0 or step == total_steps:
                self.save("scheduled" if step < total_steps else "final")
            elif step % STATE_EVERY == 0:
                self.write_state()
            if options.sample_every and step % options.sample_every == 0:
                record_samples(
                    self.run_dir, step, s.model, s.arms, s.device, s.autocast, time.time()
                )
            if self.step_sleep_s > 0:
                time.sleep(self.step_sleep_s)
        self.report(self.saver.wait())
        say(f"trainer: done at step {self.step}")
        return 0
