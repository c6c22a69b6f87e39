"""`python -m trainwarden.trainer`: parse the command line, start a session, run the loop.

Exit status: 0 when done or stopped on request, 2 for bad usage or a refused resume
(one line on stderr), anything else is a crash (3 for an injected one).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from trainwarden.supervisor.contract import (
    ENV_LR_SCALE,
    ENV_PIVOT,
    ENV_RESUME,
    ENV_SKIP_DATA,
    PIVOT_ON,
    skip_data_text,
)
from trainwarden.trainer.corpus import ARM_NAMES
from trainwarden.trainer.errors import TrainerError
from trainwarden.trainer.options import DEFAULT_BAD_DATA_STEPS, Options
from trainwarden.trainer.presets import PRESETS

if TYPE_CHECKING:  # the real import would pull in torch before arguments are checked
    from trainwarden.trainer.startup import Session

EPILOG = f"""\
environment:
  {ENV_RESUME + "=PATH":<25} resume from this checkpoint (--resume wins)
  {ENV_PIVOT + "=" + PIVOT_ON:<25} like --fresh-bandit
  {ENV_SKIP_DATA + "=W":<25} data windows skipped after loss spikes, W = [[from,to],...]:
  {"":<25} from step `from` on, train on the data `to - from` steps later
  {ENV_LR_SCALE + "=X":<25} multiply the learning rate schedule by X (default 1)

signals:
  SIGTERM, SIGINT           finish the step, save a checkpoint, exit 0
  SIGUSR1                   finish the step, save a checkpoint, continue

exit status: 0 done or stopped on request, 2 bad usage or resume refused,
anything else a crash (3 for --crash-at-step).

test-only environment (for the trainer's and supervisor's own tests):
  TRAINER_TEST_SLOW_SAVE_S=S    sleep S seconds between writing a .tmp and its rename
  TRAINER_TEST_STEP_SLEEP_S=S   sleep S seconds after every step
  TRAINER_TEST_RESET_DATA=1     on resume, replay the data from step 1 (breaks exactness)
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, no usage dump: the daemon's log shows the last line as the reason.
        self.exit(2, f"trainer: error: {message} (see python -m trainwarden.trainer --help)\n")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _arm_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in ARM_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown arm {unknown[0] if unknown else text!r}: known arms are {', '.join(ARM_NAMES)}"
        )
    return tuple(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m trainwarden.trainer",
        description="Train a small GPT on the Python stdlib, speaking the trainwarden contract.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run-dir", type=Path, default=Path("."), help="run directory (default .)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument(
        "--steps", type=_positive, required=True, help="planned total steps of the run"
    )
    parser.add_argument("--save-every", type=_positive, default=100, metavar="K")
    parser.add_argument(
        "--sample-every", type=_non_negative, metavar="K", help="default: --save-every; 0: never"
    )
    parser.add_argument(
        "--eval-every",
        type=_non_negative,
        metavar="K",
        help="validation loss on the held-out split every K steps and at the last"
        " (default: --save-every; 0: never)",
    )
    parser.add_argument("--seed", type=_non_negative, default=1337)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--resume", metavar="PATH", help="checkpoint .bin to resume from")
    parser.add_argument(
        "--fresh-bandit",
        action="store_true",
        help="keep weights and Adam moments but restart the data bandit under policy.json",
    )
    parser.add_argument(
        "--arms",
        type=_arm_list,
        default=ARM_NAMES,
        help=f"comma-separated data arms (default {','.join(ARM_NAMES)})",
    )
    parser.add_argument(
        "--sync-save",
        action="store_true",
        help="write each checkpoint inside the step loop, which waits for the whole write"
        " (default: snapshot at the step boundary, write in the background)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model (worth it on a GPU; the first steps pay the compile)",
    )
    faults = parser.add_argument_group(
        "fault injection (for testing a supervisor; crash, NaN and hang fire once per run"
        " directory, bad data is bad every time it is trained on)"
    )
    faults.add_argument(
        "--crash-at-step", type=_positive, metavar="N", help="exit 3 right after logging step N"
    )
    faults.add_argument(
        "--nan-at-step", type=_positive, metavar="N", help="step N logs NaN and poisons the weights"
    )
    faults.add_argument(
        "--hang-at-step",
        type=_positive,
        metavar="N",
        help="stop making progress after step N; only SIGKILL ends it",
    )
    faults.add_argument(
        "--bad-data-at-step",
        type=_positive,
        metavar="N",
        help="the data of data steps N.. has random next bytes: the loss spikes until skipped",
    )
    faults.add_argument(
        "--bad-data-steps",
        type=_positive,
        metavar="K",
        help=f"how many data steps are bad (default {DEFAULT_BAD_DATA_STEPS})",
    )
    return parser


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.bad_data_steps is not None and args.bad_data_at_step is None:
        parser.error("--bad-data-steps needs --bad-data-at-step N (where the bad data starts)")
    return Options(
        run_dir=args.run_dir,
        preset=args.preset,
        steps=args.steps,
        save_every=args.save_every,
        sample_every=args.save_every if args.sample_every is None else args.sample_every,
        eval_every=args.save_every if args.eval_every is None else args.eval_every,
        seed=args.seed,
        device=args.device,
        resume=args.resume,
        fresh_bandit=args.fresh_bandit,
        arms=args.arms,
        sync_save=args.sync_save,
        compile=args.compile,
        crash_at_step=args.crash_at_step,
        nan_at_step=args.nan_at_step,
        hang_at_step=args.hang_at_step,
        bad_data_at_step=args.bad_data_at_step,
        bad_data_steps=args.bad_data_steps or DEFAULT_BAD_DATA_STEPS,
    )


def banner(session: Session) -> str:
    preset = session.preset
    origin = (
        f"resuming from {session.resumed_from} at step {session.start_step}"
        if session.resumed_from
        else "fresh start"
    )
    pivot = session.bandit.pivots
    phase = f", bandit phase {pivot}" if pivot else ""
    plan = session.plan
    skips = f", data skipped {skip_data_text(plan.skip_windows)}" if plan.skip_windows else ""
    scale = f", LR x{plan.lr_scale:g}" if plan.lr_scale != 1.0 else ""
    compiled = " with torch.compile" if plan.options.compile else ""
    return (
        f"trainer: preset {preset.name}, {session.n_params} params, "
        f"{preset.tokens_per_step} tokens/step, device {session.device_label}{compiled}, "
        f"arms {','.join(session.arms)}, {origin}{phase}{skips}{scale}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv)
    # Flags first: a SIGTERM during the slow imports below must still mean "stop".
    from trainwarden.trainer.signals import SignalFlags

    flags = SignalFlags()
    flags.install()
    # torch works without NumPy here; its import-time complaint would only clutter the log.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        from trainwarden.trainer.plan import make_plan

        plan = make_plan(options)
        # torch only now: a refusal above costs a fraction of a second, not three.
        from trainwarden.trainer.loop import TrainingLoop
        from trainwarden.trainer.startup import start_session

        session = start_session(plan)
    except TrainerError as exc:
        print(f"trainer: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    print(banner(session), flush=True)
    return TrainingLoop(session, flags).run()
