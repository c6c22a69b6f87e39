"""The Lightning callback in this process, with no daemon: what it does under the daemon's
environment (signals, saves, step lines) and that outside it, it does nothing."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support import PYTHON
from trainwarden.integrations.lightning import resume_ckpt_path

pl = pytest.importorskip("lightning.pytorch")

pytestmark = pytest.mark.timeout(180)


class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
    """A two-layer net; `at_step` maps a step (before it runs) to something to do then."""

    def __init__(self, at_step: dict[int, Callable[[], Any]] | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )
        self.at_step = at_step or {}
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step + 1 in self.at_step:
            self.at_step.pop(self.global_step + 1)()
        g = torch.Generator().manual_seed(self.global_step)
        x = torch.randn(8, 4, generator=g)
        loss = torch.nn.functional.mse_loss(self.net(x), x.sum(dim=1, keepdim=True))
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> torch.utils.data.DataLoader[int]:
        return torch.utils.data.DataLoader(range(5), batch_size=None)  # type: ignore[arg-type]


def fit(
    root: Path,
    model: Tiny,
    steps: int,
    before: Any = None,
    model_checkpoint: bool = False,
    accumulate: int = 1,
    **callback: Any,
) -> Any:
    """A fit of `model` with the callback (and `before`, a callback listed ahead of it)."""
    from trainwarden.integrations.lightning import TrainwardenCallback

    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=model_checkpoint,
        accumulate_grad_batches=accumulate,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=[*([before] if before else []), TrainwardenCallback(**callback)],
    )
    trainer.fit(model)
    return trainer


def handlers() -> tuple[Any, Any]:
    return signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)


def step_lines(text: str) -> list[int]:
    return [int(line.split(",")[0][6:]) for line in text.splitlines() if line.startswith("step: ")]


def test_sigusr1_saves_and_sigterm_saves_and_fit_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("TRAINWARDEN_RUN_DIR", str(tmp_path))
    before = handlers()
    me = os.getpid()
    model = Tiny({3: lambda: os.kill(me, signal.SIGUSR1), 6: lambda: os.kill(me, signal.SIGTERM)})
    trainer = fit(tmp_path, model, steps=50)
    # fit returned (no SIGTERMException from Lightning's own handler) at the step asked.
    assert trainer.global_step == 6 and not trainer.interrupted
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step=000003.ckpt", "step=000006.ckpt"]
    saved = torch.load(tmp_path / "checkpoints" / "step=000006.ckpt", weights_only=True)
    assert saved["global_step"] == 6
    out, err = capsys.readouterr()
    assert step_lines(out) == [1, 2, 3, 4, 5, 6]
    assert "ModelCheckpoint" not in err
    assert handlers() == before  # put back at teardown


def test_with_gradient_accumulation_one_line_per_optimisation_step_with_its_mean_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("TRAINWARDEN_RUN_DIR", str(tmp_path))
    model = Tiny()
    fit(tmp_path, model, steps=3, accumulate=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step: ")]
    assert step_lines("\n".join(lines)) == [1, 2, 3]
    assert len(model.losses) == 5
    printed = [float(line.split(", ")[1][6:]) for line in lines]
    # Five batches an epoch: step 3 is cut short by the epoch's end after one micro-batch.
    a, b, c, d, e = model.losses
    assert printed == pytest.approx([(a + b) / 2, (c + d) / 2, e], rel=1e-6)


def test_a_model_checkpoint_writing_into_the_daemons_folder_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    # Lightning's default ModelCheckpoint, with logger=False, writes to ROOT/checkpoints.
    monkeypatch.setenv("TRAINWARDEN_RUN_DIR", str(tmp_path))
    fit(tmp_path, Tiny(), steps=2, model_checkpoint=True)
    err = capsys.readouterr().err
    assert "trainwarden: ModelCheckpoint writes into the daemon's checkpoint folder" in err
    assert "enable_checkpointing=False" in err


def test_every_n_steps_saves_periodically_and_a_late_request_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TRAINWARDEN_RUN_DIR", str(tmp_path))
    me = os.getpid()

    class LateRequest(pl.Callback):  # type: ignore[misc,name-defined]
        """A SIGUSR1 after the last step's end, as the training loop is finishing."""

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            os.kill(me, signal.SIGUSR1)

    fit(tmp_path, Tiny(), steps=7, every_n_steps=3)
    periodic = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert periodic == ["step=000003.ckpt", "step=000006.ckpt"]
    (tmp_path / "again").mkdir()
    monkeypatch.setenv("TRAINWARDEN_RUN_DIR", str(tmp_path / "again"))
    fit(tmp_path, Tiny(), steps=7, before=LateRequest(), every_n_steps=3)
    names = sorted(p.name for p in (tmp_path / "again" / "checkpoints").iterdir())
    assert names == ["step=000003.ckpt", "step=000006.ckpt", "step=000007.ckpt"]


def test_outside_the_daemon_it_installs_prints_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.delenv("TRAINWARDEN_RUN_DIR", raising=False)
    monkeypatch.setenv("TRAINWARDEN_RESUME", str(tmp_path / "step=000003.ckpt"))
    monkeypatch.chdir(tmp_path)
    assert resume_ckpt_path() is None
    before = handlers()
    seen: list[tuple[Any, Any]] = []
    fit(tmp_path, Tiny({2: lambda: seen.append(handlers())}), steps=4, every_n_steps=1)
    assert list(tmp_path.iterdir()) == []
    assert step_lines(capsys.readouterr().out) == []
    # Lightning's own SIGTERM handler is in place during fit, untouched.
    assert seen[0][0] == before[0] and seen[0][1] != before[1]
    assert handlers() == before


def test_resume_path_names_what_the_daemon_chose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRAINWARDEN_RUN_DIR", str(tmp_path))
    monkeypatch.delenv("TRAINWARDEN_RESUME", raising=False)
    assert resume_ckpt_path() is None
    monkeypatch.setenv("TRAINWARDEN_RESUME", "/runs/x/checkpoints/step=000040.ckpt")
    assert resume_ckpt_path() == "/runs/x/checkpoints/step=000040.ckpt"


@pytest.mark.parametrize("every", [0, -5, 2.5, True])
def test_every_n_steps_must_be_a_positive_integer(every: Any):
    from trainwarden.integrations.lightning import TrainwardenCallback

    with pytest.raises(ValueError, match="every_n_steps"):
        TrainwardenCallback(every_n_steps=every)


def test_the_callback_pickles_by_name_for_spawned_workers(monkeypatch: pytest.MonkeyPatch):
    from trainwarden.integrations.lightning import TrainwardenCallback

    monkeypatch.setenv("TRAINWARDEN_RUN_DIR", "/runs/x")
    copy = pickle.loads(pickle.dumps(TrainwardenCallback(every_n_steps=5)))
    assert type(copy) is TrainwardenCallback and copy.every_n_steps == 5


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)


def test_without_lightning_the_error_is_one_line_naming_the_extra():
    done = python(
        "import sys\n"
        "sys.modules['lightning'] = sys.modules['pytorch_lightning'] = None\n"
        "from trainwarden.integrations import lightning\n"
        "assert lightning.resume_ckpt_path() is None\n"
        "try:\n"
        "    from trainwarden.integrations.lightning import TrainwardenCallback\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1
    assert "pip install 'trainwarden[lightning]'" in done.stdout


def test_a_pytorch_lightning_script_gets_a_pytorch_lightning_callback():
    done = python(
        "import pytorch_lightning as pl\n"
        "from trainwarden.integrations.lightning import TrainwardenCallback\n"
        "assert issubclass(TrainwardenCallback, pl.Callback), TrainwardenCallback.__mro__\n"
    )
    assert done.returncode == 0, done.stderr[-2000:]
