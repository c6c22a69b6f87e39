"""EXP3 over the data arms, with the operator's caps and floors on every probability.

The reward for pulling an arm is how much that arm's training loss fell since it was
last pulled (squashed into [0, 1]): an arm the model is still learning from pays more.
Everything here is plain Python floats and hashes, no torch and no hidden RNG state, so
the arm for a step is a pure function of (seed, step, bandit state) and a resumed run
picks exactly the arms the uninterrupted run picked.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from trainwarden.supervisor.contract import normalized_policy

GAMMA = 0.1
"""Share of probability mass spread uniformly, so every arm keeps being explored."""
ETA = 0.1
"""Learning rate of the exponential weights."""
MIN_IMPORTANCE_PROB = 1e-3
"""An arm capped near 0 is importance-weighted as if at 1e-3, so one lucky pull cannot
blow its weight up to infinity."""
REWARD_SCALE = 20.0
"""A 5 % relative loss drop since the arm's last pull earns about 0.88."""
EMA_DECAY = 0.9
PROJECTION_ITERATIONS = 200
PROJECTION_TOLERANCE = 1e-15


@dataclass
class ArmState:
    log_weight: float = 0.0
    pulls: int = 0
    ema_reward: float = 0.0
    last_loss: float | None = None
    prob: float = 0.0
    cap: float = 1.0
    floor: float = 0.0


def project_into_bounds(
    probs: Sequence[float], floors: Sequence[float], caps: Sequence[float]
) -> list[float]:
    """The closest distribution to `probs` with floor_i <= p_i <= cap_i and sum 1.

    Finds the shift t with sum(clip(p_i + t, floor_i, cap_i)) = 1 by bisection: the sum
    is monotone in t, at most 1 for t = -1 and at least 1 for t = 1 whenever
    sum(floors) <= 1 <= sum(caps), which policy validation guarantees.
    """

    def clipped_sum(shift: float) -> float:
        return math.fsum(
            min(max(p + shift, f), c) for p, f, c in zip(probs, floors, caps, strict=True)
        )

    lo, hi = -1.0, 1.0
    for _ in range(PROJECTION_ITERATIONS):
        mid = (lo + hi) / 2
        if hi - lo <= PROJECTION_TOLERANCE:
            break
        if clipped_sum(mid) < 1:
            lo = mid
        else:
            hi = mid
    shifted = [min(max(p + hi, f), c) for p, f, c in zip(probs, floors, caps, strict=True)]
    # Bisection leaves a rounding-sized residue; hand it to arms with room for it.
    for i, (f, c) in enumerate(zip(floors, caps, strict=True)):
        residue = 1.0 - math.fsum(shifted)
        if residue == 0:
            break
        delta = min(residue, c - shifted[i]) if residue > 0 else max(residue, f - shifted[i])
        shifted[i] = min(max(shifted[i] + delta, f), c)
    return shifted


def uniform_for(seed: int, step: int) -> float:
    """A reproducible number in [0, 1) for the arm draw of `step`."""
    digest = hashlib.blake2b(f"bandit:{seed}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class Bandit:
    def __init__(self, arms: Sequence[str], policy: dict[str, Any], seed: int) -> None:
        self.seed = seed
        self.policy = normalized_policy(policy, arms)
        self.arms: dict[str, ArmState] = {}
        for name in arms:
            bounds = self.policy["arms"][name]
            self.arms[name] = ArmState(cap=bounds["cap"], floor=bounds["floor"])
        self.pivots = 0
        self.started_at_step = 0
        self.zombies: list[str] = []
        self._refresh_probs()

    # -- the algorithm -------------------------------------------------------------

    def _refresh_probs(self) -> None:
        states = list(self.arms.values())
        top = max(s.log_weight for s in states)
        weights = [math.exp(s.log_weight - top) for s in states]
        total = math.fsum(weights)
        mixed = [(1 - GAMMA) * w / total + GAMMA / len(states) for w in weights]
        bounded = project_into_bounds(mixed, [s.floor for s in states], [s.cap for s in states])
        for state, prob in zip(states, bounded, strict=True):
            state.prob = prob

    def probabilities(self) -> dict[str, float]:
        return {name: state.prob for name, state in self.arms.items()}

    def choose(self, step: int) -> str:
        """The arm to train on at `step`; never one whose probability is 0."""
        u = uniform_for(self.seed, step)
        cumulative = 0.0
        chosen = None
        for name, state in self.arms.items():
            if state.prob <= 0:
                continue
            chosen = name
            cumulative += state.prob
            if u < cumulative:
                break
        assert chosen is not None, "policy validation guarantees some arm has probability > 0"
        return chosen

    def update(self, arm: str, loss: float) -> float:
        """Learn from the loss of a step trained on `arm`; returns the reward (0.5 if none)."""
        state = self.arms[arm]
        state.pulls += 1
        if not math.isfinite(loss):
            # A diverged step teaches nothing about the data; the daemon deals with it.
            return 0.5
        if state.last_loss is None or state.last_loss <= 0:
            reward = 0.5
        else:
            relative_drop = (state.last_loss - loss) / state.last_loss
            reward = 0.5 + 0.5 * math.tanh(REWARD_SCALE * relative_drop)
        state.last_loss = loss
        state.ema_reward = EMA_DECAY * state.ema_reward + (1 - EMA_DECAY) * reward
        # Importance weighting keeps the reward estimate unbiased for rarely pulled arms.
        estimate = reward / max(state.prob, MIN_IMPORTANCE_PROB)
        state.log_weight += ETA * estimate / len(self.arms)
        top = max(s.log_weight for s in self.arms.values())
        for other in self.arms.values():
            other.log_weight -= top
        self._refresh_probs()
        return reward

    # -- phases and persistence ----------------------------------------------------

    def start_phase(self, step: int, pivots: int) -> None:
        self.pivots = pivots
        self.started_at_step = step

    def to_state(self) -> dict[str, Any]:
        """Everything exact resume needs (kept in the checkpoint's sidecar)."""
        return {
            "algorithm": "exp3",
            "seed": self.seed,
            "arms": {name: asdict(state) for name, state in self.arms.items()},
            "phase": {"pivots": self.pivots, "started_at_step": self.started_at_step},
            "policy": self.policy,
            "zombies": list(self.zombies),
        }

    @classmethod
    def from_state(
        cls, saved: dict[str, Any], arms: Sequence[str], policy: dict[str, Any], seed: int
    ) -> tuple[Bandit, list[str]]:
        """Rebuild a saved bandit under `policy`; returns it and the arms it had to drop.

        A saved arm that is no longer among `arms` (its data source is gone) becomes a
        zombie: listed, never pulled again. An arm new since the save starts at the top
        weight, so it gets tried.
        """
        bandit = cls(arms, policy, seed)
        saved_arms = saved.get("arms", {})
        dropped = [name for name in saved_arms if name not in bandit.arms]
        for name, state in bandit.arms.items():
            old = saved_arms.get(name)
            if old is None:
                continue
            state.log_weight = float(old["log_weight"])
            state.pulls = int(old["pulls"])
            state.ema_reward = float(old["ema_reward"])
            last = old.get("last_loss")
            state.last_loss = None if last is None else float(last)
        phase = saved.get("phase", {})
        bandit.start_phase(int(phase.get("started_at_step", 0)), int(phase.get("pivots", 0)))
        zombies = [z for z in saved.get("zombies", []) if z not in bandit.arms]
        bandit.zombies = zombies + [name for name in dropped if name not in zombies]
        top = max(s.log_weight for s in bandit.arms.values())
        for state in bandit.arms.values():
            state.log_weight -= top
        bandit._refresh_probs()
        return bandit, dropped

    def state_document(self, step: int, now: float) -> dict[str, Any]:
        """The `.state.json` the daemon and TUI read."""
        return {
            "step": step,
            "arms": {
                name: {
                    "pulls": s.pulls,
                    "ema_reward": s.ema_reward,
                    "prob": s.prob,
                    "cap": s.cap,
                    "floor": s.floor,
                }
                for name, s in self.arms.items()
            },
            "phase": {
                "pivots": self.pivots,
                "steps_in_phase": step - self.started_at_step,
                "started_at_step": self.started_at_step,
            },
            "policy": self.policy,
            "zombies": list(self.zombies),
            "updated_at": now,
        }
