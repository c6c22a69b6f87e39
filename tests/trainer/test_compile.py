"""--compile: the real trainer trains through torch.compile (inductor, on the CPU here),
saves checkpoints of the plain module, and resumes from one into a compiled model exactly.

Slow for a trainer test (inductor compiles the forward and backward in each process,
tens of seconds on a small machine): one straight run and one resumed run, nothing more.
"""

from __future__ import annotations

import shutil

import pytest

from tests.trainer.trainer_process import checkpoint, read_bin, run_trainer, step_losses

ARGS = ("--preset", "tiny", "--steps", "4", "--save-every", "2", "--device", "cpu", "--compile")


@pytest.mark.slow  # inductor compiles C++ twice: about 150 s beside a busy loop
def test_compiled_training_saves_and_resumes_bit_exactly(tmp_path):
    # A cache of our own: proof that inductor really compiled, and no reuse of another run's.
    cache = tmp_path / "inductor-cache"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"

    straight = run_trainer(straight_dir, *ARGS, env=env, timeout=300)
    assert straight.returncode == 0, straight.stderr
    assert sorted(step_losses(straight.stdout)) == [1, 2, 3, 4]
    assert cache.is_dir() and any(path.is_file() for path in cache.rglob("*")), (
        "torch.compile left nothing in its cache: the model was not compiled"
    )

    (resumed_dir / "checkpoints").mkdir(parents=True)
    source = checkpoint(straight_dir, 2)
    for path in (source, source.with_suffix(".json")):
        shutil.copy(path, resumed_dir / "checkpoints" / path.name)
    resumed = run_trainer(
        resumed_dir, *ARGS, "--resume", str(resumed_dir / "checkpoints" / source.name), env=env,
        timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    replayed = step_losses(resumed.stdout)
    assert sorted(replayed) == [3, 4]
    assert replayed == {step: step_losses(straight.stdout)[step] for step in (3, 4)}
    # Weights, m and v of the final step, byte for byte; and they are the trained ones
    # (a compiled copy with parameters of its own would leave the saved weights as they were).
    final = read_bin(checkpoint(straight_dir, 4))
    assert read_bin(checkpoint(resumed_dir, 4)) == final
    assert final[2] != read_bin(source)[2]
