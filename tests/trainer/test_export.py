"""`trainwarden export` of the reference trainer's checkpoints and of an hf-trainer folder:
weights only, in the asked dtype, byte for byte what the safetensors format says; the
logit difference on the held-out probe batch; the fp32 export loads back exactly."""

from __future__ import annotations

import json
import struct
import subprocess
import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch warns at import when NumPy is absent
    import torch
from safetensors.torch import load_file, save_file

from tests.support import PYTHON
from tests.trainer.trainer_process import checkpoint, run_trainer
from trainwarden.trainer.checkpoint import read_regions
from trainwarden.trainer.model import GPT
from trainwarden.trainer.presets import PRESETS

TINY = PRESETS["tiny"]
BYTES_PER_VALUE = {"fp32": 4, "fp16": 2, "bf16": 2}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def export(source: Path, out: Path, dtype: str) -> dict:
    done = cli("export", str(source), "--out", str(out), "--dtype", dtype, "--json", cwd=out.parent)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def header_bytes(path: Path) -> int:
    """The safetensors header: its 8-byte length plus the JSON it announces."""
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """step_000020.bin of a 20-step tiny run, on CPU."""
    run_dir = tmp_path_factory.mktemp("export")
    done = run_trainer(run_dir, "--steps", "20", "--save-every", "10", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    return checkpoint(run_dir, 20)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_export_writes_weights_only_in_the_dtype(trained: Path, tmp_path: Path, dtype: str):
    out = tmp_path / "out"
    report = export(trained, out, dtype)
    weights = out / "model.safetensors"
    n = TINY.n_params
    resume, exported = trained.stat().st_size, weights.stat().st_size
    print(
        f"{dtype}: resume file {resume} bytes, export {exported} bytes,"
        f" ratio {exported / resume:.4f}, max logit diff {report['logit_max_abs_diff']:.3g}"
    )
    assert (report["resume_bytes"], report["export_bytes"]) == (resume, exported)
    assert resume == 8 + 12 * n
    # Exactly the weights in the dtype plus the header: no Adam moment is in the file.
    assert exported == header_bytes(weights) + BYTES_PER_VALUE[dtype] * n
    # So against the resume file's 12 bytes a parameter: 1/3 for fp32, 1/6 for half, off
    # only by the header (under 1 % of the tiny model's 120,576 parameters' bytes).
    assert abs(exported / resume - BYTES_PER_VALUE[dtype] / 12) < 0.01
    loaded = load_file(weights)  # the safetensors package reads what we wrote
    assert sum(t.numel() for t in loaded.values()) == n
    expected = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    assert {t.dtype for t in loaded.values()} == {expected}
    config = json.loads((out / "config.json").read_text())
    assert config | {"dtype": dtype} == config
    assert (config["preset"], config["d_model"], config["n_layer"]) == ("tiny", 64, 2)
    assert report["probe"]["split"] == "held_out"

    difference = report["logit_max_abs_diff"]
    if dtype == "fp32":
        assert difference == 0.0
    else:
        assert difference > 0.0
    if dtype == "fp16":
        # fp16 keeps 11 significant bits: each weight moves by at most 2^-11 of itself,
        # which moves the tiny model's logits by about 1e-3, well under 1e-2.
        assert difference < 1e-2


def test_the_fp32_export_loads_back_into_the_model_exactly(trained: Path, tmp_path: Path):
    out = tmp_path / "out"
    export(trained, out, "fp32")
    model = GPT(TINY)
    missing, unexpected = model.load_state_dict(load_file(out / "model.safetensors"), strict=False)
    # The head is tied to the token embedding: stored once, under wte.weight.
    assert (missing, unexpected) == (["lm_head.weight"], [])
    assert model.lm_head.weight is model.wte.weight
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(flat, read_regions(trained).weights)


def hf_folder(root: Path) -> Path:
    """An hf-trainer checkpoint folder as the Trainer leaves it (shapes of a tiny model)."""
    folder = root / "checkpoint-5"
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    save_file(
        {
            "transformer.wte.weight": torch.randn(32, 8),
            "transformer.h.0.attn.c_attn.weight": torch.randn(8, 24),
            "transformer.h.0.attn.bias": torch.ones(1, 1, 4, 4, dtype=torch.bool),
            "position_ids": torch.arange(4),
        },
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    (folder / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "torch_dtype": "float32"})
    )
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"state": torch.zeros(8)}, folder / name)
    return folder


def test_an_hf_trainer_checkpoint_is_inspected_and_converted(tmp_path: Path):
    folder = hf_folder(tmp_path)
    done = cli("inspect", str(folder), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["format"], report["step"], report["check"]["ok"]) == ("hf-trainer", 5, True)
    assert report["tensors"] == {
        "files": ["model.safetensors"],
        "count": 4,
        "numel": 32 * 8 + 8 * 24 + 16 + 4,
        "dtypes": {"F32": 2, "BOOL": 1, "I64": 1},
    }
    # optimizer.pt is a pickle: nothing about it is known without torch.
    assert report["unknown"] == ["optimizer_numel", "optimizer_ratio", "recorded_digest"]
    assert {f["name"] for f in report["files"]} >= {"checkpoint-5/optimizer.pt"}

    out = tmp_path / "out"
    result = export(folder, out, "bf16")
    source = load_file(folder / "model.safetensors")
    converted = load_file(out / "model.safetensors")
    assert converted.keys() == source.keys()
    for name, tensor in source.items():
        if tensor.is_floating_point():
            assert torch.equal(converted[name], tensor.to(torch.bfloat16))
        else:
            assert torch.equal(converted[name], tensor)  # masks and ids stay as they were
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert result["logit_max_abs_diff"] is None
    assert result["export_bytes"] == (out / "model.safetensors").stat().st_size
    assert result["resume_bytes"] == report["bytes"]


def test_a_weight_beyond_fp16_is_refused_and_leaves_out_empty(trained: Path, tmp_path: Path):
    big = tmp_path / "run" / "checkpoints" / trained.name
    big.parent.mkdir(parents=True)
    data = bytearray(trained.read_bytes())
    data[8:12] = struct.pack("<f", 1e6)  # finite, a valid checkpoint; fp16 stops at 65,504
    big.write_bytes(bytes(data))
    big.with_suffix(".json").write_bytes(trained.with_suffix(".json").read_bytes())
    out = tmp_path / "out"
    done = cli("export", str(big), "--out", str(out), "--dtype", "fp16", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "trainwarden: wte.weight holds values beyond the range of fp16; export as bf16 or fp32"
    )
    assert not out.exists()  # nothing half written, not even the folder; --out is reusable
    report = export(big, out, "bf16")
    assert load_file(out / "model.safetensors")["wte.weight"].reshape(-1)[0].item() == 999424.0
    assert report["logit_max_abs_diff"] > 0


def test_an_export_that_fails_midway_removes_what_it_wrote(trained: Path, tmp_path: Path):
    out = tmp_path / "out"
    (out / "config.json.tmp").mkdir(parents=True)  # the config cannot be written
    done = subprocess.run(
        [PYTHON, "-m", "trainwarden.trainer.export", str(trained), "--format", "andrea-bin",
         "--out", str(out), "--dtype", "fp16"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "config.json.tmp" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json.tmp"]  # the weights are gone


def test_an_export_to_a_full_volume_names_that_volume_and_leaves_no_folder(
    trained: Path, tmp_path: Path, mounts
):
    full = mounts.tmpfs(tmp_path / "full", "64k")
    out = full / "export"
    done = cli("export", str(trained), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "No space left on device" in line and str(full) in line, line
    assert trained.name not in line  # the checkpoint is not to blame
    assert not out.exists() and list(full.iterdir()) == []
