"""The andrea-bin file the trainer writes, and the files it refuses to resume from."""

from __future__ import annotations

import json
import os
import signal
import time
import warnings

with warnings.catch_warnings():
    # torch complains at import that NumPy is absent; nothing here needs NumPy.
    warnings.simplefilter("ignore")
    import torch

from tests.trainer.trainer_process import (
    COMMON_ARGS,
    SAVE_EVERY,
    STEPS,
    checkpoint,
    live_trainer,
    run_trainer,
)
from trainwarden.plugins.formats.andrea_bin import AndreaBin
from trainwarden.trainer.adamw import AdamW
from trainwarden.trainer.checkpoint import (
    load_into,
    param_step_counts,
    read_regions,
    save_checkpoint,
)
from trainwarden.trainer.model import GPT
from trainwarden.trainer.presets import PRESETS


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def trained_model(steps: int) -> tuple[GPT, AdamW]:
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    optimizer = AdamW(
        [{"params": list(model.parameters()), "weight_decay": 0.1}], 1e-3, (0.9, 0.95), 1e-8
    )
    for _ in range(steps):
        tokens = torch.randint(0, 256, (2, 17))
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer


def test_bin_layout_and_regions_round_trip(tmp_path):
    model, optimizer = trained_model(steps=2)
    path = save_checkpoint(tmp_path, 7, model, optimizer, {"step": 7})
    n_params = model.n_params()

    assert path.name == "step_000007.bin"
    assert path.stat().st_size == 8 + 12 * n_params
    info = AndreaBin().verify(path)
    assert (info.step, info.n_params) == (7, n_params)
    assert json.loads(path.with_suffix(".json").read_text()) == {"step": 7}
    assert not list(tmp_path.glob("*.tmp"))

    regions = read_regions(path)
    params = list(model.parameters())
    assert torch.equal(regions.weights, flat(params))
    assert torch.equal(regions.exp_avg, flat(optimizer.state[p].exp_avg for p in params))
    assert torch.equal(regions.exp_avg_sq, flat(optimizer.state[p].exp_avg_sq for p in params))
    assert regions.exp_avg.abs().sum() > 0  # the moments really are in there

    other_model, other_optimizer = trained_model(steps=0)
    load_into(other_model, other_optimizer, regions, param_step_counts(model, optimizer))
    for mine, theirs in zip(params, other_model.parameters(), strict=True):
        assert torch.equal(mine, theirs)
        assert torch.equal(
            optimizer.state[mine].exp_avg_sq, other_optimizer.state[theirs].exp_avg_sq
        )
        assert other_optimizer.state[theirs].step == 2


def assert_refused(result, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "step:" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0]


def test_truncated_checkpoint_is_refused(straight, tmp_path):
    copy = straight.copy_checkpoint(30, tmp_path)
    os.truncate(copy, copy.stat().st_size - 4)
    result = run_trainer(tmp_path, *COMMON_ARGS, "--resume", str(copy))
    assert_refused(result, "cannot resume from", "truncated")


def test_header_step_that_disagrees_with_the_name_is_refused(straight, tmp_path):
    copy = straight.copy_checkpoint(30, tmp_path)
    renamed = copy.with_name("step_000040.bin")
    copy.rename(renamed)
    copy.with_suffix(".json").rename(renamed.with_suffix(".json"))
    result = run_trainer(tmp_path, *COMMON_ARGS, "--resume", str(renamed))
    assert_refused(result, "header step 30 does not match the step 40")


def test_foreign_checkpoint_of_another_size_is_refused(tmp_path):
    foreign = tmp_path / "checkpoints" / "step_000010.bin"
    foreign.parent.mkdir()
    foreign.write_bytes((10).to_bytes(4, "little") + (1000).to_bytes(4, "little") + bytes(12_000))
    result = run_trainer(tmp_path, *COMMON_ARGS, "--resume", str(foreign))
    assert_refused(result, "holds 1000 parameters")


def test_missing_sidecar_is_refused(straight, tmp_path):
    copy = straight.copy_checkpoint(30, tmp_path, with_sidecar=False)
    result = run_trainer(tmp_path, *COMMON_ARGS, "--resume", str(copy))
    assert_refused(result, "step_000030.json is missing")


def test_changed_data_is_refused_naming_what_changed(straight, tmp_path):
    copy = straight.copy_checkpoint(30, tmp_path)
    sidecar_path = copy.with_suffix(".json")
    sidecar = json.loads(sidecar_path.read_text())
    sidecar["data_fingerprint"]["arms"]["docs"] = "0" * 16
    sidecar["data_fingerprint"]["seq_len"] = 128
    sidecar_path.write_text(json.dumps(sidecar))
    result = run_trainer(tmp_path, *COMMON_ARGS, "--seed", "7", "--resume", str(copy))
    assert_refused(result, "arm 'docs' content changed", "seq_len 128 -> 64", "seed 1337 -> 7")


def test_kill_during_a_save_leaves_the_last_commit_intact(straight, tmp_path):
    copy = straight.copy_checkpoint(30, tmp_path)
    committed = copy.read_bytes()
    in_flight = copy.with_name("step_000040.bin.tmp")
    env = {"TRAINER_TEST_SLOW_SAVE_S": "60"}
    with live_trainer(tmp_path, *COMMON_ARGS, "--resume", str(copy), env=env) as trainer:
        trainer.read_until("step: 40,")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            in_flight.exists() and in_flight.stat().st_size == len(committed)
        ):
            time.sleep(0.02)
        assert in_flight.exists(), "the save of step 40 never started"
        trainer.signal(signal.SIGKILL)
        trainer.finish()

    assert copy.read_bytes() == committed
    AndreaBin().verify(copy)
    assert not checkpoint(tmp_path, 40).exists()
    names = {p.name for p in (tmp_path / "checkpoints").iterdir()}
    # The sidecar goes first, so an orphan step_000040.json may remain beside the .tmp.
    assert names - {"step_000040.bin.tmp", "step_000040.json"} == {copy.name, "step_000030.json"}
    # The in-flight file is never mistaken for a checkpoint.
    assert AndreaBin().is_in_flight(in_flight)
    assert AndreaBin().step_of(in_flight) is None


def test_every_checkpoint_of_a_run_verifies_with_the_model_size(straight):
    for step in range(SAVE_EVERY, STEPS + 1, SAVE_EVERY):
        info = AndreaBin().verify(checkpoint(straight.run_dir, step))
        assert info.n_params == PRESETS["tiny"].n_params
        assert info.bytes == 8 + 12 * info.n_params
