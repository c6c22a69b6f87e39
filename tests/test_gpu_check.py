"""bench/gpu_check.py without a GPU: its command line, its "no CUDA" exit, its arithmetic
and table, and its SIGTERM/SIGKILL resume comparison run against the real trainer on
the CPU (the GPU figures themselves need a GPU)."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from bench.gpu_check import Check
from bench.gpu_figures import (
    Row,
    compare_losses,
    format_table,
    mfu,
    model_flops_per_token,
    part_budgets,
    save_figures,
    step_lines,
    throughput,
)
from trainwarden.supervisor.contract import save_report_line
from trainwarden.trainer.presets import PRESETS

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "gpu_check.py"


def gpu_check(*args: str) -> subprocess.CompletedProcess[str]:
    # As a user runs it: a script path, from anywhere, without PYTHONPATH.
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def cuda_available() -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
    return torch.cuda.is_available()


@pytest.mark.skipif(cuda_available(), reason="this machine has a CUDA device")
def test_without_cuda_it_exits_2_with_one_line():
    result = gpu_check("--minutes", "1")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("gpu_check: no CUDA device"), result.stderr


def test_command_line():
    help_text = gpu_check("--help")
    assert help_text.returncode == 0, help_text.stderr
    for option in ("--minutes", "--out", "--json"):
        assert option in help_text.stdout
    for bad in (["--minutes", "0"], ["--minutes", "soon"], ["--bogus"]):
        result = gpu_check(*bad)
        assert result.returncode == 2, bad
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("gpu_check: error: "), result.stderr
    assert "--minutes" in gpu_check("--minutes", "0").stderr


def test_mfu_counts_6n_plus_attention_against_the_peak():
    preset = PRESETS["gpt2-124m"]
    per_token = model_flops_per_token(preset)
    assert per_token == 6 * 124_439_808 + 12 * 12 * 1024 * 768
    # 400,000 tokens/s on a 989 TFLOP/s H200 is a third of its peak.
    assert mfu(400_000, per_token, 989.0) == pytest.approx(400_000 * 859_885_056 / 989e12)
    assert mfu(400_000, per_token, None) is None


def test_throughput_skips_the_warm_up_steps():
    lines = [f"step: {n}, loss: 5.0, dt: {30.0 if n == 1 else 0.5}, lr: 0.1" for n in range(1, 8)]
    lines.insert(3, "eval: step 3, val_loss 4.9")
    measured = throughput(step_lines(lines), tokens_per_step=1000, warmup=2)
    assert measured is not None
    assert (measured.timed_steps, measured.median_step_s) == (5, 0.5)
    assert measured.tokens_per_s == pytest.approx(2000.0)
    assert throughput(step_lines(lines[:2]), 1000, warmup=2) is None


def test_save_reports_new_and_old_and_others():
    lines = [
        save_report_line("step_000004.bin", "scheduled", 1490.0, 0.061, 3.2),
        "checkpoint: step_000008.bin saved (final, 1490.0 MB, 3.21 s)",
        "checkpoint: step_000008.bin already saved at step 8",
        "step: 9, loss: 5.0, dt: 0.5",
    ]
    saves = save_figures(lines)
    assert [(s.stall_s, s.write_s) for s in saves] == [(0.061, 3.2), (3.21, 3.21)]


def test_loss_comparison_counts_replays_and_reports_the_bound():
    reference = {1: "5.000000", 2: "4.900000", 3: "4.800000"}
    exact = compare_losses(
        reference, [(1, "5.000000"), (2, "4.900000"), (2, "4.900000"), (3, "4.800000")]
    )
    assert (exact.exact, exact.compared, exact.text()) == (True, 4, "bit-exact")

    off = compare_losses(reference, [(1, "5.000000"), (2, "4.900003"), (3, "4.800000")])
    assert not off.exact
    assert off.differing == 1
    assert off.max_abs_diff == pytest.approx(3e-6)
    assert off.text() == "max |loss diff| 3e-06"

    nan = compare_losses(reference, [(1, "nan"), (2, "4.900000"), (3, "4.800000")])
    assert math.isinf(nan.max_abs_diff)

    gap = compare_losses(reference, [(1, "5.000000"), (3, "4.800000")])
    assert (gap.exact, gap.missing, gap.text()) == (False, (2,), "1 steps never logged")
    assert compare_losses(reference, []).text() == "nothing to compare"


def test_table_and_budgets():
    table = format_table([Row("a|b", "ok", "x\ny"), Row("c", "d")])
    assert table.splitlines() == [
        "| check | result | detail |",
        "|---|---|---|",
        "| a\\|b | ok | x y |",
        "| c | d |  |",
    ]
    budgets = part_budgets(8)
    assert sum(budgets.values()) <= 8 * 60
    assert min(budgets.values()) > 0


@pytest.mark.slow  # two resumes of the real trainer, about 20 s: run by .ci/run
def test_the_resume_part_finds_cpu_resume_exact(tmp_path):
    # The part's own orchestration (SIGTERM, resume, SIGKILL, resume, compare) against the
    # real trainer, on the CPU where resume is promised bit-exact.
    check = Check(minutes=8, scratch=tmp_path, device="cpu")
    check.resume()
    row = check.rows[-1]
    assert row.check == "exact resume on cpu (SIGTERM, SIGKILL)"
    assert row.result == "bit-exact", row
    figures = check.figures["resume"]
    assert figures["final_weights"] == "byte-identical"
    assert figures["compared"] >= 60  # every step, and the replayed ones again
    assert "replayed" in row.detail and "0 replayed" not in row.detail


def test_the_trainer_parts_read_the_real_trainer_on_the_cpu(tmp_path):
    # The same parts as on a GPU, with the tiny preset: the figures are the CPU's, but the
    # runs, the parsing of the trainer's step and save lines and the rows are the real ones.
    check = Check(minutes=8, scratch=tmp_path, device="cpu", big=PRESETS["tiny"])
    check.part("adamw", check.adamw)
    check.part("eager", lambda: check.speed("eager", []))
    check.part("save-sync", lambda: check.saves("save-sync", ["--sync-save"]))
    rows = {row.check: row for row in check.rows}
    assert rows["AdamW foreach vs per-parameter"].result == "bit-identical"
    # The CPU really divides (so the foreach path's _foreach_div_ matches it there).
    assert check.figures["adamw"]["scalar_division_multiplies"] is False
    speed = rows["tiny tokens/s, eager"]
    assert speed.result.endswith("tokens/s, MFU unknown"), speed  # no GPU, no peak
    assert speed.detail.startswith("20 steps after 5 warm-up"), speed
    assert check.figures["eager"]["tokens_per_s"] > 0
    saves = rows["checkpoint stall, --sync-save"]
    assert saves.result.startswith("stall median "), saves
    assert "4 saves of 1.4 MB" in saves.detail, saves
    assert len(check.figures["save-sync"]) == 4
