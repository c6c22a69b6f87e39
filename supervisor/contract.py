"""The trainer contract: what the daemon and a supervised trainer agree on, without torch.

Environment: the daemon starts each trainer with these variables (names below).
    TRAINWARDEN_RUN_DIR   the run directory
    TRAINWARDEN_SEG       which trainer start this is (1, 2, ...; the `seg` of .loss.json)
    TRAINWARDEN_RESUME    the checkpoint to resume from (absent: a fresh start)
    TRAINWARDEN_PIVOT     "1": start the bandit fresh under the new policy.json

`policy.json`: per-arm caps and floors on the data-mixing bandit's probabilities.
Shape: `{"arms": {"docs": {"cap": 0.6, "floor": 0.1}, ...}}`. An arm the file does not
name gets floor 0 and cap 1. The daemon and TUI validate a policy before writing it, so
this module must not import torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ENV_RUN_DIR = "TRAINWARDEN_RUN_DIR"
ENV_SEG = "TRAINWARDEN_SEG"
ENV_RESUME = "TRAINWARDEN_RESUME"
ENV_PIVOT = "TRAINWARDEN_PIVOT"

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
