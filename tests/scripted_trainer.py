"""A tiny trainer that speaks the contract with scripted losses: a real process for tests.

Usage: python tests/scripted_trainer.py --steps N [--save-every K] [--format step-line|llmc]
  [--nan-at S] [--hang-at S] [--drift-per-seg X] [--dt SECONDS] [--n-params P]
  [--usr1 save|ignore] [--term save|ignore|default] [--bad-data-at N --bad-data-steps K]
Signals: by default SIGTERM saves and exits and SIGUSR1 is not handled (its default action
kills the trainer). --usr1 save checkpoints at the next step on SIGUSR1, --usr1 ignore
catches it and does nothing; --term ignore catches SIGTERM and keeps training, --term
default installs no handler (SIGTERM kills it).
Losses are 5 - 0.001 * step (+ X * (seg - 1) with --drift-per-seg, seg from TRAINWARDEN_SEG).
With --bad-data-at N, the steps that consume the data of steps [N, N + K) log --bad-loss
instead (a loss spike caused by data): TRAINWARDEN_SKIP_DATA is honoured through
contract.data_step, so skipping the window cures it. TRAINWARDEN_LR_SCALE is read and shown.
The first line says what the start got: `scripted trainer: seg S, from step N, skip_data
[...], lr_scale X`.
Checkpoints are valid andrea-bin files of --n-params parameters; TRAINWARDEN_RESUME is honoured.
--slow-save S pauses S seconds halfway through each checkpoint's write; a write that fails
(a full disk) removes its .tmp and the trainer exits 1 with the error.
--save-report prints the contract's save report line after each save (a synchronous save:
its stall is the whole save, its write the write and fsync of the file).
--arms docs,code,tests gives it a data bandit as the contract describes it (for the pivot,
the bandit topic and the TUI): it reads RUN/policy.json at start, writes RUN/.state.json
(arms with prob/cap/floor, the policy, phase.pivots, zombies) and, with --sample-every K,
RUN/.samples.json; each checkpoint gets a sidecar step_NNNNNN.json with its arms and
phase, from which a resume takes them (arms no longer named become zombies; under
TRAINWARDEN_PIVOT=1 the phase count goes up by one). Probabilities are the policy's
bounds applied to a uniform draw, fixed for a start.
--eval-every K prints `eval: step N, val_loss X, val_docs: D, val_code: C` every K steps
(before that step's checkpoint), X = 5.2 - 0.001 * step, D = X - 0.1, C = X + 0.1;
--val-nan-at S makes the evaluation at step S nan (training losses stay finite).
--nan-once makes --nan-at fire in the first start that reaches it only (a file nan-once in
the working directory remembers it), so a rollback trains on past it.
--hang-at S hangs for good after logging step S (a SIGTERM is caught and changes nothing:
only SIGKILL ends it), in the first start that reaches it (a file hung-once in the
working directory remembers it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import sys
import time
from pathlib import Path

from trainwarden.supervisor.contract import (
    ENV_LR_SCALE,
    ENV_PIVOT,
    ENV_SKIP_DATA,
    data_step,
    load_policy,
    parse_lr_scale,
    parse_skip_data,
    save_report_line,
)


def write_json(path: Path, value: object) -> None:
    """Atomically, as the contract asks of the trainer's side files."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(value))
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


class Bandit:
    """Arms under the policy in force: what the daemon reads from .state.json and the
    sidecars. Probabilities are the policy's bounds applied to a uniform draw."""

    def __init__(self, run_dir: Path, arms: list[str], resumed: dict | None) -> None:
        self.run_dir = run_dir
        self.arms = arms
        self.policy = load_policy(run_dir / "policy.json", arms)
        resumed = resumed or {}
        pivots = int(resumed.get("pivots", 0))
        self.pivots = pivots + 1 if os.environ.get(ENV_PIVOT) == "1" else pivots
        old = [a for a in resumed.get("arms", []) if a not in arms]
        self.zombies = [*resumed.get("zombies", []), *old]
        self.probs = self._probabilities()

    def _probabilities(self) -> dict[str, float]:
        bounds = self.policy["arms"]
        probs = {
            a: min(max(1 / len(self.arms), bounds[a]["floor"]), bounds[a]["cap"]) for a in self.arms
        }
        for _ in range(len(self.arms)):
            spare = 1.0 - sum(probs.values())
            free = [
                a
                for a in self.arms
                if (bounds[a]["cap"] if spare > 0 else bounds[a]["floor"]) != probs[a]
            ]
            if abs(spare) < 1e-12 or not free:
                break
            for a in free:
                probs[a] = min(
                    max(probs[a] + spare / len(free), bounds[a]["floor"]), bounds[a]["cap"]
                )
        return probs

    def sidecar(self) -> dict:
        return {"arms": self.arms, "pivots": self.pivots, "zombies": self.zombies}

    def write_state(self, step: int) -> None:
        bounds = self.policy["arms"]
        arms = {a: {"prob": self.probs[a], "cap": bounds[a]["cap"], "floor": bounds[a]["floor"],
                    "pulls": step, "ema": 1.0} for a in self.arms}  # fmt: skip
        state = {"step": step, "arms": arms, "policy": self.policy,
                 "phase": {"pivots": self.pivots}, "zombies": self.zombies}  # fmt: skip
        write_json(self.run_dir / ".state.json", state)

    def write_samples(self, step: int) -> None:
        samples = [{"arm": a, "text": f"def {a}_{step}():"} for a in self.arms]
        write_json(self.run_dir / ".samples.json", {"step": step, "samples": samples})


def save(
    run_dir: Path,
    step: int,
    n_params: int,
    report: str | None = None,
    sidecar: dict | None = None,
    slow_s: float = 0.0,
) -> None:
    """Commit step_NNNNNN.bin (after its sidecar, when there is one); with `report` (the
    save's reason), print its save report. `slow_s` pauses halfway through the write (a
    kill can land inside it). A failed write (a full disk) leaves no .tmp and raises."""
    began = time.perf_counter()
    directory = run_dir / "checkpoints"
    directory.mkdir(exist_ok=True)
    final = directory / f"step_{step:06d}.bin"
    if sidecar is not None:
        write_json(final.with_suffix(".json"), sidecar)
    tmp = final.with_name(final.name + ".tmp")
    data = struct.pack("<ii", step, n_params) + bytes(12 * n_params)
    try:
        with open(tmp, "wb") as f:
            written = time.perf_counter()
            f.write(data[: len(data) // 2])
            f.flush()
            time.sleep(slow_s)
            f.write(data[len(data) // 2 :])
            f.flush()
            os.fsync(f.fileno())
            write_s = time.perf_counter() - written
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, final)
    if report is not None:
        size_mb = (8 + 12 * n_params) / 1e6
        stall_s = time.perf_counter() - began
        print(save_report_line(final.name, report, size_mb, stall_s, write_s), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--format", default="step-line")
    parser.add_argument("--nan-at", type=int, default=None)
    parser.add_argument("--nan-once", action="store_true")
    parser.add_argument("--hang-at", type=int, default=None)
    parser.add_argument("--drift-per-seg", type=float, default=0.0)
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--val-nan-at", type=int, default=None)
    parser.add_argument("--dt", type=float, default=0.01)
    parser.add_argument("--n-params", type=int, default=1000)
    parser.add_argument("--usr1", choices=["none", "save", "ignore"], default="none")
    parser.add_argument("--term", choices=["save", "ignore", "default"], default="save")
    parser.add_argument("--bad-data-at", type=int, default=None)
    parser.add_argument("--bad-data-steps", type=int, default=1)
    parser.add_argument("--bad-loss", type=float, default=15.0)
    parser.add_argument("--save-report", action="store_true")
    parser.add_argument("--slow-save", type=float, default=0.0)
    parser.add_argument("--arms", default="")
    parser.add_argument("--sample-every", type=int, default=0)
    args = parser.parse_args()
    run_dir = Path.cwd()
    seg = int(os.environ.get("TRAINWARDEN_SEG", "1"))
    start = 0
    resume = os.environ.get("TRAINWARDEN_RESUME")
    resumed = None
    if resume:
        with open(resume, "rb") as f:
            start, _ = struct.unpack("<ii", f.read(8))
        sidecar = Path(resume).with_suffix(".json")
        if sidecar.exists():
            resumed = json.loads(sidecar.read_text())
    bandit = Bandit(run_dir, args.arms.split(","), resumed) if args.arms else None
    stop = False
    save_asked = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    def on_usr1(*_: object) -> None:
        nonlocal save_asked
        save_asked = args.usr1 == "save"

    if args.term == "save":
        signal.signal(signal.SIGTERM, on_term)
    elif args.term == "ignore":
        signal.signal(signal.SIGTERM, lambda *_: None)
    if args.usr1 != "none":
        signal.signal(signal.SIGUSR1, on_usr1)
    windows = parse_skip_data(os.environ.get(ENV_SKIP_DATA))
    lr_scale = parse_lr_scale(os.environ.get(ENV_LR_SCALE))
    print(
        f"scripted trainer: seg {seg}, from step {start}, "
        f"skip_data {[list(w) for w in windows]}, lr_scale {lr_scale}",
        flush=True,
    )
    if bandit is not None:
        print(
            f"scripted trainer: bandit phase {bandit.pivots}, zombies {bandit.zombies}", flush=True
        )
        bandit.write_state(start)
    bad = args.bad_data_at
    step = start
    sidecar = None if bandit is None else bandit.sidecar()
    while step < args.steps and not stop:
        step += 1
        time.sleep(args.dt)
        loss = 5.0 - 0.001 * step + args.drift_per_seg * (seg - 1)
        if bad is not None and bad <= data_step(step, windows) < bad + args.bad_data_steps:
            loss = args.bad_loss
        nan = args.nan_at == step and not (args.nan_once and Path("nan-once").exists())
        if nan and args.nan_once:
            Path("nan-once").touch()
        text = "nan" if nan else f"{loss:.6f}"
        if args.format == "llmc":
            print(
                f"step {step:4d}/{args.steps} | train loss {text} | norm 1.0000 | lr 6.00e-04 | "
                f"{args.dt * 1000:.2f} ms | 10.0% bf16 MFU | 512 tok/s",
                flush=True,
            )
        else:
            print(f"step: {step}, loss: {text}, dt: {args.dt}, tokens: 512", flush=True)
        if args.eval_every and step % args.eval_every == 0:
            val = 5.2 - 0.001 * step
            values = [f"{v:.6f}" for v in (val, val - 0.1, val + 0.1)]
            if args.val_nan_at == step:
                values = ["nan"] * 3
            print(
                f"eval: step {step}, val_loss {values[0]}, val_docs: {values[1]}, "
                f"val_code: {values[2]}",
                flush=True,
            )
        if bandit is not None and step % 10 == 0:
            bandit.write_state(step)
        if bandit is not None and args.sample_every and step % args.sample_every == 0:
            bandit.write_samples(step)
        if args.hang_at == step and not Path("hung-once").exists():
            Path("hung-once").touch()
            print(f"trainer: injected hang at step {step}", file=sys.stderr, flush=True)
            while True:
                time.sleep(1)
        if step % args.save_every == 0 or step == args.steps or save_asked:
            reason = "requested" if save_asked else "scheduled"
            save_asked = False
            report = reason if args.save_report else None
            save(run_dir, step, args.n_params, report, sidecar, args.slow_save)
    if stop:
        report = "stop" if args.save_report else None
        save(run_dir, step, args.n_params, report, sidecar, args.slow_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
