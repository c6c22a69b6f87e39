"""The torch-pt format's "lightning" preset: Lightning's `.ckpt` names, keys and step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainwarden.plugins.formats.torch_pt import TorchPt
from trainwarden.supervisor.contract import lightning_checkpoint_name
from trainwarden.supervisor.errors import CheckpointInvalid, ConfigError

pytestmark = pytest.mark.timeout(120)

LIGHTNING = {"options": {"preset": "lightning"}}


def lightning_checkpoint(step: int, *, weights_only: bool = False) -> dict[str, object]:
    """The shape `Trainer.save_checkpoint` writes (the keys that matter here)."""
    checkpoint: dict[str, object] = {
        "epoch": 1,
        "global_step": step,
        "pytorch-lightning_version": "2.6.6",
        "state_dict": {"net.0.weight": torch.zeros(4, 3), "net.0.bias": torch.ones(4)},
        "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 2}}}},
        "callbacks": {},
    }
    if not weights_only:
        checkpoint["optimizer_states"] = [{"state": {}, "param_groups": [{"lr": 0.01}]}]
        checkpoint["lr_schedulers"] = []
    return checkpoint


def save(path: Path, obj: object) -> Path:
    torch.save(obj, path)
    return path


def test_the_preset_names_the_callbacks_files_and_model_checkpoints_defaults(tmp_path: Path):
    fmt = TorchPt(LIGHTNING)
    assert lightning_checkpoint_name(100) == "step=000100.ckpt"
    assert fmt.step_of(tmp_path / "step=000100.ckpt") == 100
    assert fmt.step_of(tmp_path / "epoch=0-step=100.ckpt") == 100
    assert fmt.step_of(tmp_path / "epoch=12-step=4800.ckpt") == 4800
    for other in (
        "last.ckpt",
        "epoch=3.ckpt",
        "step=000100.ckpt.tmp",
        "step_000100.pt",
        "ckpt_000100.pt",
        "epoch=0-step=100-v1.ckpt",
        "step=x.ckpt",
    ):
        assert fmt.step_of(tmp_path / other) is None, other
    assert fmt.is_in_flight(tmp_path / "step=000100.ckpt.tmp")
    assert not fmt.is_in_flight(tmp_path / "step=000100.ckpt")


def test_a_lightning_checkpoint_verifies_with_the_step_and_parameter_count(tmp_path: Path):
    path = save(tmp_path / "step=000040.ckpt", lightning_checkpoint(40))
    info = TorchPt(LIGHTNING).verify(path)
    assert (info.step, info.bytes, info.n_params) == (40, path.stat().st_size, 16)


def test_global_step_must_match_the_name_and_the_required_keys_be_there(tmp_path: Path):
    fmt = TorchPt(LIGHTNING)
    wrong = save(tmp_path / "epoch=0-step=40.ckpt", lightning_checkpoint(41))
    with pytest.raises(CheckpointInvalid, match="its step value 41 does not match the step 40"):
        fmt.verify(wrong)
    weights = save(tmp_path / "step=000040.ckpt", lightning_checkpoint(40, weights_only=True))
    with pytest.raises(CheckpointInvalid, match="missing required key.* optimizer_states"):
        fmt.verify(weights)
    # An option beside the preset wins: a weights-only run can say what it keeps.
    relaxed = TorchPt({"options": {"preset": "lightning", "required_keys": ["state_dict"]}})
    assert relaxed.verify(weights).step == 40
    assert relaxed.step_of(tmp_path / "epoch=0-step=7.ckpt") == 7


def test_an_unknown_preset_is_a_config_error_with_an_example():
    with pytest.raises(ConfigError, match=r"'checkpoints\.options\.preset' = 'lighting'") as caught:
        TorchPt({"options": {"preset": "lighting"}})
    assert "'lightning'" in str(caught.value) and 'preset = "lightning"' in str(caught.value)
