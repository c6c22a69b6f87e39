"""A real `transformers.Trainer` under the real daemon, with the shipped callback.

The trainer script below is what a user writes (a tiny Llama built from its config,
byte-level tokens, a fixed dataset, a seed, CPU) plus the callback line; a test hook slows
its steps so the test can act mid-run, and one save so it can kill the trainer while a
checkpoint folder is half written. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.daemon import running_daemon
from tests.support.procs import belongs_to_run
from tests.support.runs import PYTHON, REPO, journal, make_run
from tests.support.wait import wait_for
from trainwarden.plugins.parsers.hf_trainer import HfTrainerParser

STEPS = 40
SAVE_STEPS = 10

TRAIN_SCRIPT = textwrap.dedent(
    '''
    """A tiny Llama trained with transformers' Trainer, plus trainwarden's one line."""

    import os
    import time

    import torch
    from transformers import (
        LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments,
    )

    from trainwarden.integrations.hf import TrainwardenCallback, resume_from_checkpoint

    STEPS = int(os.environ.get("HF_STEPS", "40"))
    STEP_SLEEP_S = float(os.environ.get("HF_STEP_SLEEP_S", "0"))
    SLOW_SAVE_STEP = int(os.environ.get("HF_SLOW_SAVE_STEP", "-1"))
    SEQ = 32
    TEXT = b"The daemon restarts the trainer from the newest verified checkpoint. " * 40


    class Bytes(torch.utils.data.Dataset):
        """Byte-level tokens: example i is bytes i*SEQ.. of TEXT; labels are the inputs."""

        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.tensor(list(TEXT[i * SEQ : (i + 1) * SEQ]), dtype=torch.long)
            return {"input_ids": ids, "labels": ids}


    class Pace(TrainerCallback):
        """Test hook: slow steps, so the test can act while training runs."""

        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(STEP_SLEEP_S)


    class Record(TrainerCallback):
        """Test hook (HF_RECORD_DIR): each rank writes its pid to rank<R>.pid and appends
        `save STEP` at each save and `end STEP` when training ends to rank<R>.log."""

        def __init__(self, where):
            self.where = where
            os.makedirs(where, exist_ok=True)

        def note(self, args, line):
            with open(os.path.join(self.where, f"rank{args.process_index}.log"), "a") as f:
                print(line, file=f)

        def on_train_begin(self, args, state, control, **kwargs):
            with open(os.path.join(self.where, f"rank{args.process_index}.pid"), "w") as f:
                f.write(str(os.getpid()))

        def on_save(self, args, state, control, **kwargs):
            self.note(args, f"save {state.global_step}")

        def on_train_end(self, args, state, control, **kwargs):
            self.note(args, f"end {state.global_step}")


    def slow_rng_save(original):
        def save(self, output_dir):
            # Test hook: the weights and optimizer are written, trainer_state.json is not.
            if self.state.global_step == SLOW_SAVE_STEP:
                print(f"slow save at step {SLOW_SAVE_STEP}", flush=True)
                time.sleep(2)
            return original(self, output_dir)

        return save


    Trainer._save_rng_state = slow_rng_save(Trainer._save_rng_state)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ,
    )
    args = TrainingArguments(
        output_dir=os.environ.get("HF_OUTPUT", "checkpoints"),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="steps",
        save_steps=int(os.environ.get("HF_SAVE_STEPS", "10")),
        seed=0,
        data_seed=0,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        save_only_model=os.environ.get("HF_SAVE_ONLY_MODEL") == "1",
        enable_jit_checkpoint=os.environ.get("HF_JIT") == "1",
        ddp_backend=os.environ.get("HF_DDP_BACKEND"),  # "gloo" for CPU workers under torchrun
    )
    callbacks = [Pace()]
    if os.environ.get("HF_RECORD_DIR"):
        callbacks.append(Record(os.environ["HF_RECORD_DIR"]))
    if os.environ.get("HF_CALLBACK", "1") == "1":
        callbacks.append(TrainwardenCallback())
    trainer = Trainer(
        model=LlamaForCausalLM(config), args=args, train_dataset=Bytes(), callbacks=callbacks
    )
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())
    print("train() returned", flush=True)
    '''
)

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def hf_run(
    run: Path, env: dict[str, str] | None = None, options: dict[str, Any] | None = None
) -> Path:
    run.mkdir(parents=True)
    (run / "train.py").write_text(TRAIN_SCRIPT)
    checkpoints: dict[str, Any] = {"format": "hf-trainer", "keep_last": 3}
    if options:
        checkpoints["options"] = options
    return make_run(
        run,
        [PYTHON, str(run / "train.py")],
        trainer={"env": {**OFFLINE, **(env or {})}, "stop_timeout_s": 120.0},
        checkpoints=checkpoints,
        restart={"backoff_initial_s": 0.0, "stall_timeout_s": 300.0},
        telemetry={"parser": "hf-trainer", "logging_steps": 1},
    )


def loss_by_step(run: Path) -> dict[int, float]:
    """Each step's loss from .loss.json, the newest segment's for a replayed step."""
    newest: dict[int, tuple[int, float]] = {}
    for line in (run / ".loss.json").read_bytes().splitlines():
        row = orjson.loads(line)
        if row["step"] not in newest or row["seg"] >= newest[row["step"]][0]:
            newest[row["step"]] = (row["seg"], row["loss"])
    return {step: loss for step, (_, loss) in sorted(newest.items())}


def trainer_state(folder: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((folder / "trainer_state.json").read_text())
    return state


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same script run once, outside the daemon: its final weights and losses."""
    where = tmp_path_factory.mktemp("hf-reference")
    (where / "train.py").write_text(TRAIN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWARDEN_")}
    env.update(OFFLINE, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [PYTHON, str(where / "train.py")], cwd=where, env=env, capture_output=True, text=True,
        timeout=600, check=True,
    )  # fmt: skip
    parser = HfTrainerParser({"logging_steps": 1})
    records = [r for line in out.stdout.splitlines() if (r := parser.parse(line)) is not None]
    losses = {record.step: record.loss for record in records}
    assert sorted(losses) == list(range(1, STEPS + 1)), out.stdout[-2000:]
    final = where / "checkpoints" / f"checkpoint-{STEPS}"
    return {
        "weights": (final / "model.safetensors").read_bytes(),
        "losses": losses,
    }


def wait_step(daemon: Any, at_least: int, timeout: float = 300.0) -> dict[str, Any]:
    status: dict[str, Any] = wait_for(
        lambda: (s := daemon.status()).get("step") is not None and s["step"] >= at_least and s,
        timeout,
        0.05,
        what=f"step {at_least}",
    )
    return status


def kill_trainer(daemon: Any, run: Path) -> int:
    pid = daemon.status()["trainer_pid"]
    assert pid and belongs_to_run(pid, run)
    os.kill(pid, signal.SIGKILL)
    return int(pid)


def spawns(run: Path) -> list[dict[str, Any]]:
    return [r for r in journal(run) if r["kind"] == "spawn"]


# ----------------------------------------------------------------------------- save and stop


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param({}, id="plain"),
        pytest.param({"HF_JIT": "1"}, id="enable_jit_checkpoint"),
        pytest.param({"HF_SAVE_ONLY_MODEL": "1"}, id="save_only_model"),
    ],
)
def test_save_wait_saves_and_training_goes_on_then_stop_saves_and_exits_0(
    tmp_path: Path, variant: dict[str, str]
):
    options = {"required_files": []} if "HF_SAVE_ONLY_MODEL" in variant else None
    env = {"HF_STEPS": "100000", "HF_SAVE_STEPS": "100000", "HF_STEP_SLEEP_S": "0.05", **variant}
    run = hf_run(tmp_path / "run", env, options)
    with running_daemon(run) as daemon:
        first = wait_step(daemon, 3)
        saved = daemon.request("save", wait=True, timeout=300.0)
        folder = run / "checkpoints" / f"checkpoint-{saved['step']}"
        assert trainer_state(folder)["global_step"] == saved["step"] >= 3
        # Training went on in the same process after the save.
        later = wait_step(daemon, saved["step"] + 3)
        assert later["trainer_pid"] == first["trainer_pid"]

        result = daemon.request("stop", timeout=300.0)
        assert result["outcome"] == "saved" and result["steps_lost"] == 0, result
        stopped = [r for r in journal(run) if r["kind"] == "trainer_stopped"]
        assert stopped[-1]["returncode"] == 0
        assert "train() returned" in (run / "training.log").read_text()
        newest = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("checkpoint-*"))
        assert newest >= stopped[-1]["last_step"] > saved["step"]
        assert len(spawns(run)) == 1


# ----------------------------------------------------------------------------- crashes


# A soak (over a minute beside a busy loop: three kills, the daemon's among them), in the
# slow tier; .ci/run runs it. One kill and a restart: the plain trainer's test below.
@pytest.mark.slow
def test_sigkills_one_inside_a_save_and_a_daemon_kill_end_bit_identical(
    tmp_path: Path, uninterrupted
):
    env = {"HF_STEP_SLEEP_S": "0.1", "HF_SLOW_SAVE_STEP": "30"}
    run = hf_run(tmp_path / "run", env)
    with running_daemon(run) as daemon:
        wait_step(daemon, 5)
        kill_trainer(daemon, run)
        wait_for(lambda: len(spawns(run)) == 2, 120, 0.05, what="the first restart")
        in_flight = run / "checkpoints" / "checkpoint-30"
        wait_for(
            lambda: "slow save at step 30" in (run / "training.log").read_text(), 300, 0.02,
            what="the save of step 30 in progress",
        )  # fmt: skip
        assert in_flight.is_dir() and not (in_flight / "trainer_state.json").exists()
        kill_trainer(daemon, run)
        wait_for(lambda: len(spawns(run)) == 3, 120, 0.05, what="the second restart")
        # Then the daemon: the trainer goes on with no daemon watching; its lines wait in
        # the log for the next daemon, which counts every step once.
        wait_step(daemon, 32)
        daemon.kill()
        wait_for(
            lambda: (run / "training.log").read_text().count("'loss'") >= 36, 120, 0.05,
            what="steps logged while no daemon ran",
        )  # fmt: skip
        daemon.start()
        daemon.wait_state("finished", timeout=600.0)

    resumed = [(s.get("resume") or {}).get("step") for s in spawns(run)]
    assert resumed[0] is None and resumed[2] == 20, resumed
    recovery = [r for r in journal(run) if r["kind"] == "boot_recovery"][-1]
    lost = recovery["last_logged_step"] - (recovery["resume_step"] or 0)
    assert recovery["last_logged_step"] >= 32 and recovery["steps_lost"] == max(lost, 0)
    final = run / "checkpoints" / f"checkpoint-{STEPS}"
    state = trainer_state(final)
    assert state["global_step"] == STEPS
    logged = [entry["step"] for entry in state["log_history"] if "loss" in entry]
    assert logged == list(range(1, STEPS + 1))
    assert (final / "model.safetensors").read_bytes() == uninterrupted["weights"]
    assert loss_by_step(run) == uninterrupted["losses"]


def test_a_plain_trainer_under_a_daemon_killed_and_restarted_keeps_every_steps_loss(
    tmp_path: Path, uninterrupted
):
    # Without the callback (a Trainer that knows nothing of trainwarden). With it, the same
    # daemon kill is part of the SIGKILL test above.
    env = {"HF_STEP_SLEEP_S": "0.1", "HF_CALLBACK": "0"}
    run = hf_run(tmp_path / "run", env)
    with running_daemon(run) as daemon:
        wait_step(daemon, 24)
        daemon.kill()
        # The trainer goes on with no daemon watching; its lines wait in the log.
        wait_for(
            lambda: (run / "training.log").read_text().count("'loss'") >= 30, 120, 0.05,
            what="steps logged while no daemon ran",
        )  # fmt: skip
        daemon.start()
        daemon.wait_state("finished", timeout=600.0)

    assert loss_by_step(run) == uninterrupted["losses"]
    recovery = [r for r in journal(run) if r["kind"] == "boot_recovery"][-1]
    lost = recovery["last_logged_step"] - (recovery["resume_step"] or 0)
    assert recovery["last_logged_step"] >= 30 and recovery["steps_lost"] == max(lost, 0)
    state = trainer_state(run / "checkpoints" / f"checkpoint-{STEPS}")
    assert [e["step"] for e in state["log_history"] if "loss" in e] == list(range(1, STEPS + 1))


# ----------------------------------------------------------------------------- outside


def test_outside_the_daemon_the_callback_changes_nothing(monkeypatch: pytest.MonkeyPatch):
    from transformers import TrainerControl, TrainerState

    from trainwarden.integrations.hf import TrainwardenCallback, resume_from_checkpoint

    monkeypatch.delenv("TRAINWARDEN_RUN_DIR", raising=False)
    monkeypatch.setenv("TRAINWARDEN_RESUME", "/nowhere/checkpoint-7")
    handlers = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)
    callback = TrainwardenCallback()
    state, control = TrainerState(global_step=5), TrainerControl()
    callback.on_init_end(None, state, control)
    callback.on_train_begin(None, state, control)
    callback.on_step_end(None, state, control)
    logs = {"loss": 1.5}
    callback.on_log(None, state, control, logs=logs)
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)) == handlers
    assert not control.should_save and not control.should_training_stop
    assert logs == {"loss": 1.5}
    assert resume_from_checkpoint() is None
    assert resume_from_checkpoint("checkpoints/checkpoint-3") == "checkpoints/checkpoint-3"


def test_without_transformers_only_constructing_the_callback_fails():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["transformers"] = None  # as if it were not installed
        import trainwarden.integrations.hf as hf
        assert hf.resume_from_checkpoint() is None
        try:
            hf.TrainwardenCallback()
        except ImportError as exc:
            print(exc)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWARDEN_")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "TrainwardenCallback needs transformers: pip install 'trainwarden[hf]'"
    )


def test_the_callback_and_its_subclasses_are_trainer_callbacks(monkeypatch: pytest.MonkeyPatch):
    from transformers import TrainerCallback

    from trainwarden.integrations.hf import TrainwardenCallback

    monkeypatch.delenv("TRAINWARDEN_RUN_DIR", raising=False)

    class Mine(TrainwardenCallback):
        pass

    for made in (TrainwardenCallback(), TrainwardenCallback(), Mine()):
        assert isinstance(made, TrainerCallback) and isinstance(made, TrainwardenCallback)
        made.on_save(None, None, None)  # an event the callback leaves to TrainerCallback
    assert type(Mine()) is type(Mine()) and isinstance(Mine(), Mine)
