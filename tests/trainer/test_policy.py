from __future__ import annotations

import json

import pytest

from trainwarden.supervisor.contract import (
    PolicyError,
    default_policy,
    load_policy,
    validate_policy,
)

ARMS = ("docs", "code", "tests")


def test_a_sound_policy_is_valid():
    policy = {"arms": {"docs": {"cap": 0.6, "floor": 0.1}, "code": {"floor": 0.2}}}
    assert validate_policy(policy, ARMS) == []


def test_the_default_policy_is_valid_and_leaves_every_arm_free():
    policy = default_policy(ARMS)
    assert validate_policy(policy, ARMS) == []
    assert policy["arms"]["tests"] == {"cap": 1.0, "floor": 0.0}


def test_unknown_arm_is_named_with_the_known_ones():
    problems = validate_policy({"arms": {"x": {"cap": 0.5}}}, ARMS)
    assert problems == ["unknown arm 'x': known arms are docs, code, tests"]


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"floor": -0.1}, "floor -0.1 is outside [0, 1]"),
        ({"cap": 1.5}, "cap 1.5 is outside [0, 1]"),
        ({"floor": 0.5, "cap": 0.4}, "floor 0.5 is above cap 0.4"),
        ({"cap": "0.5"}, "cap must be a number"),
        ({"floor": True}, "floor must be a number"),
        ({"cap": float("nan")}, "cap must be a number"),
        ({"flor": 0.1}, "unknown key 'flor'"),
    ],
)
def test_per_arm_rules(entry, fragment):
    problems = validate_policy({"arms": {"docs": entry}}, ARMS)
    assert len(problems) == 1
    assert problems[0].startswith("arm 'docs': ")
    assert fragment in problems[0]


def test_floors_may_not_sum_above_one():
    policy = {"arms": {"docs": {"floor": 0.5}, "code": {"floor": 0.4}, "tests": {"floor": 0.2}}}
    [problem] = validate_policy(policy, ARMS)
    assert "floors sum to 1.1" in problem


def test_caps_must_reach_one_counting_unnamed_arms_as_cap_one():
    two_named = {"arms": {"docs": {"cap": 0.2}, "code": {"cap": 0.3}}}
    assert validate_policy(two_named, ARMS) == []  # tests keeps cap 1
    all_named = {"arms": {**two_named["arms"], "tests": {"cap": 0.4}}}
    [problem] = validate_policy(all_named, ARMS)
    assert "caps sum to 0.9" in problem


def test_sums_exactly_at_the_limits_are_valid():
    policy = {
        "arms": {
            "docs": {"floor": 0.1, "cap": 0.1},
            "code": {"floor": 0.2, "cap": 0.2},
            "tests": {"floor": 0.7, "cap": 0.7},
        }
    }
    assert validate_policy(policy, ARMS) == []


def test_shape_errors_are_reported_not_raised():
    assert validate_policy([], ARMS)[0].startswith("a policy is a JSON object like")
    assert "'arms' must be an object" in validate_policy({"arms": [1]}, ARMS)[0]
    assert "unknown key 'caps'" in validate_policy({"caps": {}}, ARMS)[0]


def test_every_violation_gets_its_own_message():
    policy = {"arms": {"x": {}, "docs": {"cap": 2}, "code": {"floor": -1}}}
    assert len(validate_policy(policy, ARMS)) == 3


def test_load_policy_fills_defaults_and_raises_the_first_problem(tmp_path):
    path = tmp_path / "policy.json"
    assert load_policy(path, ARMS) == default_policy(ARMS)  # absent file

    path.write_text(json.dumps({"arms": {"docs": {"cap": 0.6, "floor": 0.1}}}))
    loaded = load_policy(path, ARMS)
    assert loaded["arms"]["docs"] == {"cap": 0.6, "floor": 0.1}
    assert loaded["arms"]["code"] == {"cap": 1.0, "floor": 0.0}

    path.write_text(json.dumps({"arms": {"nope": {}, "docs": {"cap": 3}}}))
    with pytest.raises(PolicyError, match="unknown arm 'nope'"):
        load_policy(path, ARMS)

    path.write_text("{not json")
    with pytest.raises(PolicyError, match="not valid JSON"):
        load_policy(path, ARMS)


def test_policy_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, trainwarden.supervisor.contract, trainwarden.trainer; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
