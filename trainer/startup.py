"""Turning a plan into a live session: torch settings, model, optimizer, restored state."""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainwarden.trainer.adamw import AdamW
from trainwarden.trainer.bandit import Bandit
from trainwarden.trainer.batches import as_tokens
from trainwarden.trainer.checkpoint import load_into, read_regions
from trainwarden.trainer.corpus import Arm
from trainwarden.trainer.errors import ResumeRefused, UsageError
from trainwarden.trainer.model import GPT
from trainwarden.trainer.plan import POLICY_FILE, Plan, warn
from trainwarden.trainer.presets import Preset
from trainwarden.trainer.resume import ResumePoint

TEST_RESET_DATA_ENV = "TRAINER_TEST_RESET_DATA"
"""Test-only: on resume, replay the data from step 1 again (proves data position matters)."""
BETAS = (0.9, 0.95)
EPS = 1e-8


@dataclass
class Session:
    plan: Plan
    device: torch.device
    model: GPT
    """The plain module: checkpoints, evaluation and samples use it."""
    forward: Callable[[torch.Tensor], torch.Tensor]
    """The training forward: the model itself, or its torch.compile'd wrapper (--compile),
    which shares the model's parameters."""
    optimizer: AdamW
    tokens: dict[str, torch.Tensor]
    bandit: Bandit
    autocast: Callable[[], AbstractContextManager]
    start_step: int = 0
    data_offset: int = 0
    """Subtracted from the step to find its batch; 0 except under TRAINER_TEST_RESET_DATA."""
    tokens_seen: int = 0
    resumed_from: Path | None = None

    @property
    def device_label(self) -> str:
        if self.device.type == "cuda":
            return f"cuda ({torch.cuda.get_device_name(self.device)})"
        threads = torch.get_num_threads()
        return f"cpu ({threads} thread{'' if threads == 1 else 's'})"

    @property
    def preset(self) -> Preset:
        return self.plan.preset

    @property
    def arms(self) -> dict[str, Arm]:
        return self.plan.arms

    @property
    def n_params(self) -> int:
        return self.plan.preset.n_params


def _use_deterministic_algorithms(warn_only: bool) -> None:
    # The public torch.use_deterministic_algorithms also imports torch._inductor to
    # configure torch.compile, which this trainer never uses: 1.4 s of every start-up.
    # Call the switch underneath when it exists; fall back to the public API otherwise.
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
    else:
        setter(True, warn_only=warn_only)


def configure_torch(device_name: str, preset: Preset) -> torch.device:
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    if device_name == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available (try --device cpu)")
        # cuBLAS is only deterministic with a fixed workspace; read at first use.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        # The same switch for code torch.compile generates (inductor reads this one).
        torch.set_float32_matmul_precision("high")
    torch.set_num_threads(min(preset.cpu_threads, os.cpu_count() or 1))
    # Bit-exact resume is promised on the CPU; on CUDA some kernels (attention backward)
    # have no deterministic variant, so there we only ask for it where it exists.
    _use_deterministic_algorithms(warn_only=device_name == "cuda")
    return torch.device(device_name)


def build_optimizer(model: GPT, preset: Preset, foreach: bool | None = None) -> AdamW:
    """AdamW over the model; `foreach` (multi-tensor kernels) defaults to on for a CUDA
    model: there it saves launches, on the CPU it would only add list handling."""
    if foreach is None:
        foreach = next(model.parameters()).device.type == "cuda"
    # Decay matrices only; biases and LayerNorm gains stay undecayed.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": preset.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return AdamW(groups, lr=preset.max_lr, betas=BETAS, eps=EPS, foreach=foreach)


def start_session(plan: Plan) -> Session:
    options, preset = plan.options, plan.preset
    device = configure_torch(options.device, preset)
    # Initialise on the CPU so a given seed gives the same weights on every device.
    torch.manual_seed(options.seed)
    model = GPT(preset)
    if model.n_params() != preset.n_params:
        raise RuntimeError(f"model has {model.n_params()} params, preset says {preset.n_params}")
    model = model.to(device)
    autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext
    if device.type == "cuda" and torch.cuda.is_bf16_supported():

        def autocast() -> AbstractContextManager:
            return torch.autocast("cuda", dtype=torch.bfloat16)
    elif device.type == "cuda":
        # fp16 would need loss scaling; float32 is slower but needs nothing else.
        warn("this GPU has no bf16 support: training in float32")
    forward: Callable[[torch.Tensor], torch.Tensor] = model
    if options.compile:
        # Compiled lazily at the first step; this import of torch._dynamo and inductor
        # costs seconds, so only a run that asks for it pays.
        forward = torch.compile(model)
    session = Session(
        plan=plan,
        device=device,
        model=model,
        forward=forward,
        optimizer=build_optimizer(model, preset),
        tokens={name: as_tokens(arm.train) for name, arm in plan.arms.items()},
        bandit=Bandit(list(plan.arms), plan.policy, options.seed),
        autocast=autocast,
    )
    if plan.resume is not None:
        _restore(session, plan.resume)
    return session


def _restore(session: Session, point: ResumePoint) -> None:
    plan = session.plan
    sidecar = point.sidecar
    step_counts = sidecar["optimizer"].get("step_counts")
    if not isinstance(step_counts, list) or len(step_counts) != len(
        list(session.model.parameters())
    ):
        raise ResumeRefused(
            f"cannot resume from {point.path}: its sidecar's step counts do not fit the model"
        )
    load_into(session.model, session.optimizer, read_regions(point.path), step_counts)
    rng = sidecar.get("rng", {}).get("torch_cpu")
    if rng:
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(rng)), dtype=torch.uint8))
    session.bandit = _restored_bandit(plan, point)
    session.start_step = point.step
    session.resumed_from = point.path
    session.tokens_seen = int(sidecar.get("tokens_seen", 0))
    session.data_offset = int(sidecar.get("data_offset", 0))
    if os.environ.get(TEST_RESET_DATA_ENV) == "1":
        session.data_offset = point.step


def _restored_bandit(plan: Plan, point: ResumePoint) -> Bandit:
    saved: dict[str, Any] = point.sidecar["bandit"]
    arm_names = list(plan.arms)
    seed = plan.options.seed
    restored, dropped = Bandit.from_state(saved, arm_names, plan.policy, seed)
    for name in dropped:
        warn(f"arm {name!r} from the checkpoint has no data source any more: now a zombie")
    for name in arm_names:
        if name not in saved.get("arms", {}):
            warn(f"arm {name!r} is new since the checkpoint: it joins the bandit")
    if plan.pivot:
        fresh = Bandit(arm_names, plan.policy, seed)
        fresh.start_phase(point.step, restored.pivots + 1)
        fresh.zombies = restored.zombies
        return fresh
    if saved.get("policy", {}).get("arms") != restored.policy["arms"]:
        warn(
            f"{POLICY_FILE} differs from the policy at step {point.step}; its caps and"
            " floors apply from now on (a pivot would also restart the bandit)"
        )
    return restored
