"""The option a hint names for a name the configured format does not read (pure)."""

from __future__ import annotations

import re

import pytest

from trainwarden.supervisor.checkpoint_hints import step_pattern, unrecognised_hint


def option(hint: str) -> str:
    """The hint's last clause: what to set."""
    return hint.rsplit("; ", 1)[1]


def test_a_fixed_file_names_the_in_place_option():
    hint = unrecognised_hint("ckpt.pt", False, "torch-pt")
    assert hint.startswith("ckpt.pt matches no checkpoint name of format torch-pt")
    assert option(hint) == (
        "a file saved in place, its step under a key such as iter_num: "
        'set [checkpoints] fixed = "ckpt.pt" and step_key = "iter_num"'
    )
    hint = unrecognised_hint("ckpt.pt", False, "andrea-bin")
    assert 'set [checkpoints] format = "torch-pt" and fixed = "ckpt.pt"' in option(hint)


def test_a_step_in_another_name_names_a_pattern_that_matches_it():
    hint = unrecognised_hint("iter_600.pt", False, "torch-pt")
    assert option(hint) == r"set [checkpoints] options = { pattern = '^iter_(\d+)\.pt$' }"
    hint = unrecognised_hint("iter_600.pt", False, "andrea-bin")
    assert option(hint).startswith('set [checkpoints] format = "torch-pt" and options = {')


def test_a_trainer_folder_names_hf_trainer():
    hint = unrecognised_hint("checkpoint-600", True, "torch-pt")
    assert hint.startswith("checkpoint-600/ matches no checkpoint name")
    assert option(hint).endswith('set [checkpoints] format = "hf-trainer"')


def test_a_lightning_name_names_the_lightning_preset():
    for name in ("epoch=0-step=600.ckpt", "step=000600.ckpt"):
        assert option(unrecognised_hint(name, False, "andrea-bin")) == (
            'a Lightning checkpoint: set [checkpoints] format = "torch-pt" and '
            'options = { preset = "lightning" }'
        )


def test_another_ckpt_name_names_torch_pt_with_its_pattern():
    hint = unrecognised_hint("last-600.ckpt", False, "andrea-bin")
    assert option(hint) == (
        'a Lightning checkpoint: set [checkpoints] format = "torch-pt" and '
        r"options = { pattern = '^last-(\d+)\.ckpt$' }"
    )


def test_llmc_names_name_llmc():
    assert option(unrecognised_hint("DONE_00000600", False, "andrea-bin")).endswith('"llmc"')


@pytest.mark.parametrize("name, is_dir", [("notes.txt", False), ("logs", True), ("run-3", True)])
def test_anything_else_points_at_the_formats_section(name: str, is_dir: bool):
    assert option(unrecognised_hint(name, is_dir, "andrea-bin")) == (
        'see docs/formats.md, "Other checkpoint formats"'
    )


@pytest.mark.parametrize(
    "name, other, step",
    [
        ("iter_600.pt", "iter_1200.pt", "1200"),
        ("epoch=0-step=600.ckpt", "epoch=3-step=1800.ckpt", "1800"),
        ("model.v2.600.pth", "model.v2.700.pth", "700"),
        ("a+b(1).pt", "a+b(22).pt", "22"),
    ],
)
def test_the_pattern_matches_the_name_and_its_later_steps(name: str, other: str, step: str):
    pattern = step_pattern(name)
    assert pattern is not None and re.compile(pattern).groups == 1
    assert re.match(pattern, name)
    match = re.match(pattern, other)
    assert match is not None and match.group(1) == step


def test_names_with_quotes_stay_valid_toml():
    import tomllib

    for name in ('ck"pt.pt', "it'_1.pt"):
        setting = option(unrecognised_hint(name, False, "torch-pt")).split("set [checkpoints] ")[1]
        for key_value in setting.split(" and "):
            tomllib.loads(key_value)
