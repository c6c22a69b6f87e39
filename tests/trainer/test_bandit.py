from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from trainwarden.supervisor.contract import validate_policy
from trainwarden.trainer.bandit import Bandit, project_into_bounds

NAMES = ("a", "b", "c", "d", "e")


@st.composite
def policies(draw):
    """Valid policies over 1-5 arms, including tight ones (floor = cap, sums at the limits)."""
    k = draw(st.integers(1, len(NAMES)))
    arms = NAMES[:k]
    floors = [draw(st.floats(0, 1 / k)) for _ in arms]
    caps = [draw(st.one_of(st.just(f), st.floats(f, 1))) for f in floors]
    if sum(caps) < 1:
        # Stretch the caps just enough to admit a distribution; they stay >= the floors.
        total = sum(caps)
        caps = [1.0 if total == 0 else min(1.0, c / total) for c in caps]
    policy = {
        "arms": {n: {"floor": f, "cap": c} for n, f, c in zip(arms, floors, caps, strict=True)}
    }
    assert validate_policy(policy, arms) == []
    return arms, policy


losses = st.one_of(
    st.floats(0.01, 10),
    st.sampled_from([float("nan"), float("inf"), 0.0]),
)


def assert_within_policy(bandit: Bandit) -> None:
    probs = bandit.probabilities()
    for name, prob in probs.items():
        arm = bandit.arms[name]
        assert arm.floor <= prob <= arm.cap, (name, prob, arm)
    assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-9)


@settings(max_examples=150, deadline=None)
@given(policies(), st.lists(losses, min_size=1, max_size=40), st.integers(0, 2**31))
def test_probabilities_respect_caps_and_floors_after_every_update(case, loss_sequence, seed):
    arms, policy = case
    bandit = Bandit(arms, policy, seed)
    assert_within_policy(bandit)
    for step, loss in enumerate(loss_sequence, start=1):
        arm = bandit.choose(step)
        assert bandit.arms[arm].prob > 0, "an arm with probability 0 was pulled"
        bandit.update(arm, loss)
        assert_within_policy(bandit)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=6).map(lambda w: [x + 1e-3 for x in w]),
    st.data(),
)
def test_projection_lands_in_the_box_and_sums_to_one(weights, data):
    probs = [w / sum(weights) for w in weights]
    k = len(probs)
    floors = [data.draw(st.floats(0, 1 / k)) for _ in probs]
    caps = [data.draw(st.floats(f, 1)) for f in floors]
    if sum(caps) < 1:
        caps = [min(1.0, c / sum(caps)) if sum(caps) else 1.0 for c in caps]
    projected = project_into_bounds(probs, floors, caps)
    assert all(f <= p <= c for p, f, c in zip(projected, floors, caps, strict=True))
    assert math.isclose(sum(projected), 1.0, abs_tol=1e-9)


def test_probabilities_inside_the_box_are_left_alone():
    assert project_into_bounds([0.2, 0.3, 0.5], [0, 0, 0], [1, 1, 1]) == [0.2, 0.3, 0.5]


@settings(max_examples=50, deadline=None)
@given(policies(), st.lists(st.floats(0.5, 6), min_size=2, max_size=30), st.integers(0, 99))
def test_a_saved_and_restored_bandit_continues_exactly(case, loss_sequence, seed):
    arms, policy = case
    straight = Bandit(arms, policy, seed)
    half = len(loss_sequence) // 2
    for step, loss in enumerate(loss_sequence[:half], start=1):
        straight.update(straight.choose(step), loss)
    # Through JSON, as the sidecar stores it.
    saved = json.loads(json.dumps(straight.to_state()))
    restored, dropped = Bandit.from_state(saved, arms, policy, seed)
    assert dropped == []
    for step, loss in enumerate(loss_sequence[half:], start=half + 1):
        a, b = straight.choose(step), restored.choose(step)
        assert a == b
        straight.update(a, loss)
        restored.update(b, loss)
        assert straight.probabilities() == restored.probabilities()


def test_an_arm_capped_at_zero_is_never_pulled():
    policy = {"arms": {"a": {"cap": 0.0}, "b": {}, "c": {}}}
    bandit = Bandit(("a", "b", "c"), policy, seed=3)
    for step in range(1, 300):
        arm = bandit.choose(step)
        assert arm != "a"
        bandit.update(arm, 3.0 - step / 100)


def test_rewards_follow_falling_loss():
    bandit = Bandit(("a", "b"), {"arms": {}}, seed=0)
    bandit.update("a", 4.0)
    assert bandit.update("a", 3.0) > 0.5
    assert bandit.update("a", 3.5) < 0.5
    assert bandit.update("b", float("nan")) == 0.5


def test_a_saved_arm_without_data_becomes_a_zombie():
    three = Bandit(("docs", "code", "tests"), {"arms": {}}, seed=1)
    for step in range(1, 40):
        three.update(three.choose(step), 5.0 - step / 10)
    saved = json.loads(json.dumps(three.to_state()))

    two, dropped = Bandit.from_state(saved, ("docs", "code"), {"arms": {}}, seed=1)

    assert dropped == ["tests"]
    assert two.zombies == ["tests"]
    assert set(two.probabilities()) == {"docs", "code"}
    assert math.isclose(sum(two.probabilities().values()), 1.0)
    assert two.arms["docs"].pulls == three.arms["docs"].pulls
    for step in range(40, 200):
        arm = two.choose(step)
        assert arm != "tests"
        two.update(arm, 1.0)
    document = two.state_document(step=200, now=0.0)
    assert document["zombies"] == ["tests"]
    assert set(document["arms"]) == {"docs", "code"}
    # Saved again and restored again, the zombie stays listed once.
    again, dropped = Bandit.from_state(two.to_state(), ("docs", "code"), {"arms": {}}, seed=1)
    assert dropped == [] and again.zombies == ["tests"]


def test_state_document_shape():
    bandit = Bandit(("docs", "code"), {"arms": {"docs": {"cap": 0.6, "floor": 0.1}}}, seed=1)
    bandit.start_phase(step=100, pivots=2)
    document = bandit.state_document(step=130, now=12.5)
    assert set(document) == {"step", "arms", "phase", "policy", "zombies", "updated_at"}
    assert set(document["arms"]["docs"]) == {"pulls", "ema_reward", "prob", "cap", "floor"}
    assert document["arms"]["docs"]["cap"] == 0.6
    assert document["phase"] == {"pivots": 2, "steps_in_phase": 30, "started_at_step": 100}
    assert document["policy"]["arms"]["code"] == {"cap": 1.0, "floor": 0.0}
