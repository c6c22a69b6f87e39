"""The trainer contract: what the daemon and a supervised trainer agree on, without torch.

Environment: the daemon starts each trainer with these variables.
    TRAINWARDEN_RUN_DIR   the run directory                               ENV_RUN_DIR
    TRAINWARDEN_SEG       which trainer start this is (1, 2, ...; the
                          `seg` of .loss.json)                            ENV_SEG
    TRAINWARDEN_RESUME    the checkpoint to resume from (absent: fresh)   ENV_RESUME
    TRAINWARDEN_PIVOT     "1": start the bandit fresh under policy.json   ENV_PIVOT
  Optional, only for a trainer that declares them (`[trainer] supports`):
    TRAINWARDEN_SKIP_DATA the data windows skipped after loss spikes      ENV_SKIP_DATA
                          (JSON list of [from_step, to_step) pairs)
    TRAINWARDEN_LR_SCALE  factor on the learning rate (a float > 0)       ENV_LR_SCALE

Skipped data (`skip_data`): each window [from_step, to_step) makes the trainer jump over
the data of to_step - from_step steps at step from_step: step s consumes the data the run
without skips consumed at `data_step(s, windows)` = s + the sum of (to - from) over every
window whose from <= s. The list only grows over a run (the daemon passes all of it on
every start), so resuming any checkpoint reproduces the same data for every later step.

Files in the run directory the two sides share: policy.json (the daemon writes it at a
pivot, the trainer reads it at start), .state.json and .samples.json (the trainer
writes them, the daemon publishes and archives them).

`policy.json`: per-arm caps and floors on the data-mixing bandit's probabilities.
Shape: `{"arms": {"docs": {"cap": 0.6, "floor": 0.1}, ...}}`. An arm the file does not
name gets floor 0 and cap 1.

The `andrea-bin` checkpoint: `step_NNNNNN.bin` = [int32 step][int32 n_params]
[n_params float32 weights][n_params float32 Adam m][n_params float32 Adam v],
little-endian, so a complete file is exactly 8 + 12 x n_params bytes. It is written as
`step_NNNNNN.bin.tmp` and renamed into place (the commit); `step_NNNNNN.json` beside it
is its optional sidecar, written (through its own .tmp) before the .bin.

Who imports this: the daemon, the TUI's pivot form, the andrea-bin format plugin and the
reference trainer; it imports only the standard library (never torch, never the daemon),
so any of them can validate a policy or name a checkpoint at no cost.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------- environment

ENV_RUN_DIR = "TRAINWARDEN_RUN_DIR"
ENV_SEG = "TRAINWARDEN_SEG"
ENV_RESUME = "TRAINWARDEN_RESUME"
ENV_PIVOT = "TRAINWARDEN_PIVOT"
PIVOT_ON = "1"
"""The value of TRAINWARDEN_PIVOT that asks for a fresh bandit."""
ENV_SKIP_DATA = "TRAINWARDEN_SKIP_DATA"
ENV_LR_SCALE = "TRAINWARDEN_LR_SCALE"
SUPPORTS = ("skip_data", "lr_scale")
"""What a trainer may declare in `[trainer] supports`."""
MAX_SKIP_WINDOWS = 4096

SkipWindow = tuple[int, int]


def parse_skip_data(text: str | None) -> list[SkipWindow]:
    """TRAINWARDEN_SKIP_DATA read back; raises ValueError saying what is wrong."""
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{ENV_SKIP_DATA} is not JSON: {exc}") from exc
    if not isinstance(value, list) or len(value) > MAX_SKIP_WINDOWS:
        raise ValueError(f"{ENV_SKIP_DATA} must be a list of [from_step, to_step] pairs")
    windows = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            or not 0 <= item[0] < item[1] <= MAX_STEP
        ):
            raise ValueError(
                f"{ENV_SKIP_DATA}: {item!r} is not a [from_step, to_step) pair with "
                "0 <= from_step < to_step"
            )
        windows.append((item[0], item[1]))
    return windows


def skip_data_text(windows: Iterable[SkipWindow]) -> str:
    """The TRAINWARDEN_SKIP_DATA value for these windows (compact JSON)."""
    return json.dumps([[a, b] for a, b in windows], separators=(",", ":"))


def data_step(step: int, windows: Iterable[SkipWindow]) -> int:
    """The step whose data step `step` consumes, given the skipped windows."""
    return step + sum(b - a for a, b in windows if a <= step)


def parse_lr_scale(text: str | None) -> float:
    """TRAINWARDEN_LR_SCALE read back (1.0 when absent); raises ValueError when bad."""
    if not text:
        return 1.0
    try:
        scale = float(text)
    except ValueError:
        raise ValueError(f"{ENV_LR_SCALE} must be a number, got {text!r}") from None
    if not (math.isfinite(scale) and 0.0 < scale <= 1e6):
        raise ValueError(f"{ENV_LR_SCALE} must be a finite number > 0, got {text!r}")
    return scale


# ----------------------------------------------------------------------------- shared files

POLICY_FILE = "policy.json"
BANDIT_STATE_FILE = ".state.json"
SAMPLES_FILE = ".samples.json"

MAX_STEP = 2**31 - 1
"""The largest step any checkpoint may carry (andrea-bin's int32 header, the protocol)."""

# ----------------------------------------------------------------------------- andrea-bin

ANDREA_BIN_HEADER = struct.Struct("<ii")
"""(step, n_params), little-endian int32 each: the first 8 bytes of the file."""
ANDREA_BIN_REGIONS = ("weights", "exp_avg", "exp_avg_sq")
"""The float32 regions after the header, in file order, n_params values each."""
BYTES_PER_PARAM = 4 * len(ANDREA_BIN_REGIONS)
CHECKPOINT_SUFFIX = ".bin"
SIDECAR_SUFFIX = ".json"
TMP_SUFFIX = ".tmp"
"""Appended to a final name while its write is in flight: never counted, never resumed."""
CHECKPOINT_NAME = re.compile(r"^step_(\d{6,})\.bin$")
SIDECAR_NAME = re.compile(r"^step_(\d{6,})\.json$")


def checkpoint_name(step: int) -> str:
    """step -> `step_NNNNNN.bin` (six digits at least)."""
    return f"step_{step:06d}{CHECKPOINT_SUFFIX}"


def step_of_name(name: str) -> int | None:
    """`step_NNNNNN.bin` -> its step; None for any other name (a .tmp, a sidecar)."""
    match = CHECKPOINT_NAME.match(name)
    return int(match.group(1)) if match else None


def sidecar_path(checkpoint: Path) -> Path:
    """`step_NNNNNN.json` beside `step_NNNNNN.bin`."""
    return checkpoint.with_suffix(SIDECAR_SUFFIX)


def in_flight_path(final: Path) -> Path:
    """The temporary name a file is written under before its rename to `final`."""
    return final.with_name(final.name + TMP_SUFFIX)


def is_in_flight_name(name: str) -> bool:
    """A checkpoint or sidecar write in progress (`step_NNNNNN.bin.tmp`, `.json.tmp`)."""
    if not name.endswith(TMP_SUFFIX):
        return False
    stem = name[: -len(TMP_SUFFIX)]
    return CHECKPOINT_NAME.match(stem) is not None or SIDECAR_NAME.match(stem) is not None


def expected_size(n_params: int) -> int:
    """The size in bytes of a complete andrea-bin checkpoint of `n_params` parameters."""
    return ANDREA_BIN_HEADER.size + BYTES_PER_PARAM * n_params


# ----------------------------------------------------------------------------- save reports

SAVE_REPORT_PREFIX = "checkpoint: "
SAVE_REPORT = re.compile(r"^checkpoint: (\S+) saved \((.*)\)\s*$")
_SAVE_FIGURE = re.compile(r"\b(stall|write) ([0-9]+(?:\.[0-9]+)?) s\b")


@dataclass(frozen=True, slots=True)
class SaveReport:
    """What a trainer says about one committed save (optional for a trainer):
    `checkpoint: step_000600.bin saved (scheduled, 1490.0 MB, stall 0.058 s, write 3.214 s)`.
    `stall` is how long the step loop waited for the save (the device-to-host copy, or a
    previous write still in flight); `write` is how long the write to disk took, in the
    background for an asynchronous save. Either figure may be missing."""

    name: str
    stall_s: float | None
    write_s: float | None


def save_report_line(name: str, reason: str, size_mb: float, stall_s: float, write_s: float) -> str:
    """The line the reference trainer prints once a save is committed."""
    return (
        f"{SAVE_REPORT_PREFIX}{name} saved ({reason}, {size_mb:.1f} MB, "
        f"stall {stall_s:.3f} s, write {write_s:.3f} s)"
    )


def parse_save_report(line: str) -> SaveReport | None:
    """The save a `checkpoint: NAME saved (...)` line reports; None for any other line."""
    if not line.startswith(SAVE_REPORT_PREFIX):
        return None
    match = SAVE_REPORT.match(line.rstrip("\r\n"))
    if match is None:
        return None
    figures = {key: float(value) for key, value in _SAVE_FIGURE.findall(match.group(2))}
    return SaveReport(match.group(1), figures.get("stall"), figures.get("write"))


# ----------------------------------------------------------------------------- Lightning

LIGHTNING_CHECKPOINT_PATTERN = r"^(?:epoch=\d+-)?step=(\d+)\.ckpt$"
"""What the `torch-pt` preset "lightning" counts as a committed checkpoint: the names the
Lightning callback writes (`step=000100.ckpt`) and ModelCheckpoint's default ones
(`epoch=0-step=100.ckpt`); the one group is the step (Lightning's `global_step`)."""
LIGHTNING_REQUIRED_KEYS = ("state_dict", "optimizer_states", "loops")
"""Keys of a full Lightning checkpoint (`Trainer.save_checkpoint`): the weights, the
optimizers and the loops' progress, without which a resume restarts the epoch count."""
LIGHTNING_STEP_KEYS = ("global_step",)


def lightning_checkpoint_name(step: int) -> str:
    """step -> `step=NNNNNN.ckpt` (six digits at least), the Lightning callback's name."""
    return f"step={step:06d}.ckpt"


# ----------------------------------------------------------------------------- policy.json

DEFAULT_FLOOR = 0.0
DEFAULT_CAP = 1.0
ARM_KEYS = ("cap", "floor")
# Sums are compared with a little slack: 0.1 + 0.2 + 0.7 must count as exactly 1.
SUM_SLACK = 1e-9


class PolicyError(ValueError):
    """policy.json is unreadable or breaks a rule; the message names the rule."""


def default_policy(arms: Iterable[str]) -> dict[str, Any]:
    return {"arms": {arm: {"cap": DEFAULT_CAP, "floor": DEFAULT_FLOOR} for arm in arms}}


def _is_number(value: Any) -> bool:
    # bool is an int subclass, but `"cap": true` is a mistake, not a cap of 1.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def validate_policy(policy: Any, known_arms: Iterable[str]) -> list[str]:
    """One human-readable message per violated rule; an empty list means valid."""
    known = list(known_arms)
    known_text = ", ".join(known)
    example = '{"arms": {"docs": {"cap": 0.6, "floor": 0.1}}}'
    if not isinstance(policy, dict):
        return [f"a policy is a JSON object like {example}, got {type(policy).__name__}"]
    problems = [
        f"unknown key {key!r} at the top level (expected 'arms')" for key in policy if key != "arms"
    ]
    arms = policy.get("arms", {})
    if not isinstance(arms, dict):
        return [*problems, f"'arms' must be an object like {example}"]

    bounds = {arm: (DEFAULT_FLOOR, DEFAULT_CAP) for arm in known}
    values_ok = True
    for arm, entry in arms.items():
        if arm not in bounds:
            problems.append(f"unknown arm {arm!r}: known arms are {known_text}")
            continue
        if not isinstance(entry, dict):
            problems.append(f"arm {arm!r}: expected an object like {{'cap': 0.6, 'floor': 0.1}}")
            values_ok = False
            continue
        for key in entry:
            if key not in ARM_KEYS:
                problems.append(f"arm {arm!r}: unknown key {key!r} (expected 'cap', 'floor')")
        floor = entry.get("floor", DEFAULT_FLOOR)
        cap = entry.get("cap", DEFAULT_CAP)
        entry_ok = True
        for key, value in (("floor", floor), ("cap", cap)):
            if not _is_number(value):
                problems.append(f"arm {arm!r}: {key} must be a number in [0, 1], got {value!r}")
                entry_ok = False
            elif not 0.0 <= value <= 1.0:
                problems.append(f"arm {arm!r}: {key} {value} is outside [0, 1]")
                entry_ok = False
        if entry_ok and floor > cap:
            problems.append(f"arm {arm!r}: floor {floor} is above cap {cap}")
            entry_ok = False
        if entry_ok:
            bounds[arm] = (float(floor), float(cap))
        values_ok = values_ok and entry_ok

    # The sums only mean something once every arm's own values are sound.
    if values_ok and bounds:
        floor_sum = sum(floor for floor, _ in bounds.values())
        cap_sum = sum(cap for _, cap in bounds.values())
        if floor_sum > 1.0 + SUM_SLACK:
            problems.append(
                f"floors sum to {floor_sum:g} over arms {known_text}: must be at most 1"
                " (unnamed arms count as floor 0)"
            )
        if cap_sum < 1.0 - SUM_SLACK:
            problems.append(
                f"caps sum to {cap_sum:g} over arms {known_text}: must be at least 1"
                " (unnamed arms count as cap 1)"
            )
    return problems


def normalized_policy(policy: dict[str, Any], known_arms: Iterable[str]) -> dict[str, Any]:
    """A valid policy with every known arm spelled out (defaults filled in), as floats."""
    named = policy.get("arms", {})
    full = default_policy(known_arms)
    for arm, bounds in full["arms"].items():
        entry = named.get(arm, {})
        bounds["cap"] = float(entry.get("cap", DEFAULT_CAP))
        bounds["floor"] = float(entry.get("floor", DEFAULT_FLOOR))
    return full


def load_policy(path: Path | str, known_arms: Iterable[str]) -> dict[str, Any]:
    """The normalized policy in `path`, the default one if the file does not exist."""
    known = list(known_arms)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return default_policy(known)
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not UTF-8 text; write it as JSON") from None
    try:
        policy = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyError(f"{path}: not valid JSON: {exc}") from None
    problems = validate_policy(policy, known)
    if problems:
        raise PolicyError(f"{path}: {problems[0]}")
    return normalized_policy(policy, known)
