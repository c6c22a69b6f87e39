"""What the reference trainer's validation costs: one evaluation against one training step.

    .venv/bin/python bench/bench_eval.py [--preset tiny] [--steps 40] [--every 4]

Trains `--steps` steps of the preset on the CPU in this process, evaluating every
`--every`, and prints the median milliseconds of a step and of an evaluation (the
held-out batches of every arm, `trainer.evaluate.BATCHES_PER_ARM` each).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from trainwarden.trainer.cli import parse_options  # noqa: E402
from trainwarden.trainer.evaluate import BATCHES_PER_ARM, Evaluator  # noqa: E402
from trainwarden.trainer.loop import TrainingLoop  # noqa: E402
from trainwarden.trainer.plan import make_plan  # noqa: E402
from trainwarden.trainer.signals import SignalFlags  # noqa: E402
from trainwarden.trainer.startup import start_session  # noqa: E402


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--preset", default="tiny")
    args.add_argument("--steps", type=int, default=40)
    args.add_argument("--every", type=int, default=4)
    options = args.parse_args()
    with tempfile.TemporaryDirectory() as run_dir:
        argv = ["--run-dir", run_dir, "--preset", options.preset, "--device", "cpu"]
        session = start_session(make_plan(parse_options([*argv, "--steps", str(options.steps)])))
        loop = TrainingLoop(session, SignalFlags())
        evaluator = Evaluator(
            session.arms,
            session.plan.options.seed,
            session.preset,
            session.device,
            session.autocast,
        )
        step_s, eval_s = [], []
        for step in range(1, options.steps + 1):
            started = time.perf_counter()
            loop.train_step(step)
            step_s.append(time.perf_counter() - started)
            if step % options.every == 0:
                started = time.perf_counter()
                evaluator.evaluate(session.model, step)
                eval_s.append(time.perf_counter() - started)
    step_ms, eval_ms = (1000 * statistics.median(times) for times in (step_s, eval_s))
    print(
        f"preset {options.preset}, {len(session.arms)} arms x {BATCHES_PER_ARM} batches:"
        f" step {step_ms:.1f} ms, evaluation {eval_ms:.1f} ms ({eval_ms / step_ms:.1f} steps)"
        f" (medians of {len(step_s)} steps and {len(eval_s)} evaluations)"
    )


if __name__ == "__main__":
    main()
