import math

import pytest

from trainwarden.plugins.api import StepRecord
from trainwarden.supervisor.config_schema import TelemetryConfig
from trainwarden.supervisor.shell.telemetry import (
    PEAK_TFLOPS,
    Monitor,
    MonitorSettings,
    flops_per_token,
    peak_tflops_for,
    settings_from_config,
)

GPT2_SMALL = 124_356_864
ATTENTION = {"n_layer": 12, "seq_len": 1024, "d_model": 768}


@pytest.mark.parametrize(
    "nvml_name,peak",
    [
        ("NVIDIA GeForce RTX 4090", 165.2),
        ("NVIDIA GeForce RTX 3090", 71.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA L40S", 362.0),
    ],
)
def test_peak_for_nvml_names(nvml_name, peak):
    assert peak_tflops_for(nvml_name) == peak


@pytest.mark.parametrize(
    "nvml_name",
    [
        "NVIDIA GeForce RTX 3090 Ti",
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA H100 NVL",
        "NVIDIA L40",
        "Tesla T4",
        "",
    ],
)
def test_relatives_with_other_peaks_are_unknown(nvml_name):
    assert peak_tflops_for(nvml_name) is None


def test_table_holds_the_design_figures():
    assert PEAK_TFLOPS["H100 SXM"] == 989.0 and PEAK_TFLOPS["H100 PCIe"] == 756.0


def test_flops_per_token():
    assert flops_per_token(GPT2_SMALL) == 6 * GPT2_SMALL
    assert flops_per_token(GPT2_SMALL, ATTENTION) == 6 * GPT2_SMALL + 12 * 12 * 1024 * 768


def gpt2_monitor(**overrides):
    settings = dict(tokens_per_step=32_768, n_params=GPT2_SMALL, peak_tflops=312.0, window=20)
    settings.update(overrides)
    return Monitor(MonitorSettings(**settings))


def test_known_throughput_and_mfu():
    monitor = gpt2_monitor()
    for step in range(1, 41):
        monitor.observe(step, 3.0, 0.25, t=step * 0.25)
    snap = monitor.snapshot()
    assert snap["tokens_per_s"] == 131_072
    assert round(snap["mfu"], 4) == 0.3135
    assert round(snap["mfu_avg"], 4) == 0.3135
    assert snap["mfu_unknown_reason"] is None


def test_known_mfu_with_attention():
    monitor = gpt2_monitor(attention=ATTENTION)
    monitor.observe(1, 3.0, 0.25, t=0.0)
    monitor.observe(2, 3.0, 0.25, t=0.25)
    assert round(monitor.snapshot()["mfu"], 4) == 0.3610


def test_collapse_reference():
    assert round(gpt2_monitor(vocab_size=50257).snapshot()["collapse_loss"], 3) == 10.825
    assert gpt2_monitor().snapshot()["collapse_loss"] is None


def test_empty_snapshot_has_every_key():
    snap = Monitor().snapshot()
    assert set(snap) == {
        "step", "loss", "loss_ema", "loss_avg", "dt", "tokens_per_s", "mfu", "mfu_avg",
        "mfu_unknown_reason", "steps_per_min", "eta_s", "collapse_loss",
    }  # fmt: skip
    assert snap["step"] is None and snap["mfu"] is None


def test_tokens_per_s_is_a_rolling_window():
    monitor = gpt2_monitor(window=4)
    for step in range(1, 11):
        monitor.observe(step, 3.0, 1.0, t=float(step))
    for step in range(11, 15):  # the window now holds only these four slower steps
        monitor.observe(step, 3.0, 2.0, t=float(step * 2))
    assert monitor.snapshot()["tokens_per_s"] == 32_768 / 2.0
    # The run average weighs every step by the clock: 9 steps in 9 s, then 4 in 18 s.
    expected = flops_per_token(GPT2_SMALL) * 32_768 * 13 / (27.0 * 312e12)
    assert monitor.snapshot()["mfu_avg"] == pytest.approx(expected)


def test_loss_moving_average_and_ema():
    monitor = gpt2_monitor(window=3, ema_beta=0.5)
    for step, loss in enumerate([4.0, 2.0, 3.0, 1.0], start=1):
        monitor.observe(step, loss, 0.25, t=float(step))
    snap = monitor.snapshot()
    assert snap["loss_avg"] == pytest.approx(2.0)  # (2 + 3 + 1) / 3
    # Bias-corrected EMA with beta 0.5 over 4, 2, 3, 1.
    raw = 0.0
    for loss in [4.0, 2.0, 3.0, 1.0]:
        raw = 0.5 * raw + 0.5 * loss
    assert snap["loss_ema"] == pytest.approx(raw / (1 - 0.5**4))


def test_constant_loss_ema_is_not_biased_towards_zero():
    monitor = gpt2_monitor()
    monitor.observe(1, 3.0, 0.25, t=0.0)
    assert monitor.snapshot()["loss_ema"] == pytest.approx(3.0)


def test_non_finite_loss_is_reported_but_kept_out_of_averages():
    monitor = gpt2_monitor()
    monitor.observe(1, 3.0, 0.25, t=0.0)
    monitor.observe(2, math.nan, 0.25, t=0.25)
    snap = monitor.snapshot()
    assert math.isnan(snap["loss"])
    assert snap["loss_avg"] == 3.0 and snap["loss_ema"] == pytest.approx(3.0)


def test_steps_per_min_and_eta_from_wall_clock():
    monitor = gpt2_monitor(total_steps=1000)
    for step in range(1, 22):
        monitor.observe(step, 3.0, 0.25, t=100.0 + step * 0.5)  # 2 steps/s by the clock
        if step == 20:  # 9.5 s of steps: too few to promise a date by
            assert monitor.snapshot()["eta_s"] is None
    snap = monitor.snapshot()
    assert snap["steps_per_min"] == pytest.approx(120.0)
    assert snap["eta_s"] == pytest.approx(979 / 2.0)


def test_pace_counts_steps_not_lines():
    monitor = gpt2_monitor()
    for line in range(5):  # a trainer that logs every 10th step, one line a second
        monitor.observe(10 * (line + 1), 3.0, None, t=float(line))
    assert monitor.snapshot()["steps_per_min"] == pytest.approx(600.0)


def test_eta_unknown_without_total_and_zero_when_done():
    monitor = gpt2_monitor()
    monitor.observe(1, 3.0, 0.25, t=0.0)
    monitor.observe(2, 3.0, 0.25, t=1.0)
    assert monitor.snapshot()["eta_s"] is None
    done = gpt2_monitor(total_steps=2)
    done.observe(2, 3.0, 0.25, t=0.0)
    assert done.snapshot()["eta_s"] == 0.0


def test_replayed_steps_start_a_fresh_window():
    monitor = gpt2_monitor(window=10)
    for step in range(1, 6):
        monitor.observe(step, 3.0, 0.25, t=float(step))
    monitor.observe(3, 3.0, 0.25, t=500.0)  # restarted from a checkpoint at step 2
    monitor.observe(4, 3.0, 0.25, t=501.0)
    assert monitor.snapshot()["steps_per_min"] == pytest.approx(60.0)


def test_tokens_from_the_record_override_the_configured_count():
    monitor = gpt2_monitor(tokens_per_step=None)
    monitor.observe_record(StepRecord(1, 3.0, 0.5, {"tokens": 1000}), t=0.0)
    monitor.observe_record(StepRecord(2, 3.0, 0.5, {"tokens": 1000}), t=0.5)
    assert monitor.snapshot()["tokens_per_s"] == 2000.0


@pytest.mark.parametrize(
    "overrides,reason",
    [
        ({"peak_tflops": None, "peak_unknown_reason": "no NVIDIA GPU: set [telemetry] peak_tflops"},
         "no NVIDIA GPU"),
        ({"n_params": None}, "n_params unknown"),
        ({"tokens_per_step": None}, "tokens per step unknown"),
    ],
)  # fmt: skip
def test_unknown_inputs_give_a_reason_not_a_number(overrides, reason):
    monitor = gpt2_monitor(**overrides)
    monitor.observe(1, 3.0, 0.25, t=0.0)
    snap = monitor.snapshot()
    assert snap["mfu"] is None and snap["mfu_avg"] is None
    assert snap["mfu_unknown_reason"].startswith(reason)


def test_setters_fill_in_late_values():
    monitor = gpt2_monitor(peak_tflops=None, n_params=None)
    monitor.observe(1, 3.0, 0.25, t=0.0)
    monitor.observe(2, 3.0, 0.25, t=0.25)
    monitor.set_gpu_name("NVIDIA GeForce RTX 9999")
    assert monitor.snapshot()["mfu_unknown_reason"] == (
        "unknown GPU 'NVIDIA GeForce RTX 9999': set [telemetry] peak_tflops"
    )
    monitor.set_gpu_name("NVIDIA A100-SXM4-80GB")
    assert monitor.snapshot()["mfu_unknown_reason"].startswith("n_params unknown")
    monitor.set_n_params(GPT2_SMALL)  # e.g. from the checkpoint header
    snap = monitor.snapshot()
    assert round(snap["mfu"], 4) == 0.3135 and round(snap["mfu_avg"], 4) == 0.3135
    monitor.set_gpu_name(None)
    assert monitor.snapshot()["mfu_unknown_reason"].startswith("no NVIDIA GPU")


def test_memory_stays_bounded_by_the_window():
    monitor = gpt2_monitor(window=5)
    for step in range(1, 10_001):
        monitor.observe(step, 3.0, 0.25, t=float(step))
    assert len(monitor._recent) == 5


def test_settings_from_config():
    cfg = TelemetryConfig(
        tokens_per_step=32_768, n_params="auto", peak_tflops="auto", vocab_size=50257
    )
    settings = settings_from_config(cfg, total_steps=1000, gpu_name="NVIDIA H100 PCIe")
    assert settings.peak_tflops == 756.0 and settings.n_params is None
    assert settings.total_steps == 1000 and settings.attention is None
    not_yet = settings_from_config(cfg)
    assert not_yet.peak_tflops is None
    assert not_yet.peak_unknown_reason.startswith("GPU not identified yet")
    monitor = Monitor(not_yet)
    monitor.set_gpu_name(None)  # the sampler found no NVIDIA GPU
    assert monitor.snapshot()["mfu_unknown_reason"] == "no NVIDIA GPU: set [telemetry] peak_tflops"
    fixed = settings_from_config(
        TelemetryConfig(peak_tflops=100.0, n_params=5, attention=ATTENTION)
    )
    assert fixed.peak_tflops == 100.0 and fixed.n_params == 5 and fixed.attention == ATTENTION


def test_throughput_pace_and_mfu_share_the_wall_clock():
    """The trainer times 0.25 s a step, but its lines come every 0.3 s (data loading and
    logging outside its timer). tokens/s, steps/min and MFU all count the wall clock between
    the lines, so tokens/s is steps/min / 60 x tokens per step, as one status line shows
    them. Before: tokens/s and MFU divided by the trainer's dt (131,072 tok/s) beside
    200 steps/min (109,227 tok/s implied)."""
    monitor = gpt2_monitor()
    for step in range(1, 41):
        monitor.observe(step, 3.0, 0.25, t=step * 0.3)
    snap = monitor.snapshot()
    assert snap["steps_per_min"] == pytest.approx(200.0)
    assert snap["tokens_per_s"] == pytest.approx(snap["steps_per_min"] / 60 * 32_768)
    expected = flops_per_token(GPT2_SMALL) * 32_768 / (0.3 * 312e12)
    assert snap["mfu"] == pytest.approx(expected)
    assert snap["mfu_avg"] == pytest.approx(expected)


def test_the_run_average_counts_the_wall_clock_of_each_start_only():
    """mfu_avg: tokens over the wall-clock time between step lines of the same trainer
    start; the time between starts (a crash, its backoff, the next start's loading) is not
    training time, the slow stretches within a start are."""
    monitor = gpt2_monitor()
    for step in range(1, 11):  # 9 steps in 9 s
        monitor.observe(step, 3.0, 0.5, t=float(step))
    monitor.new_segment()
    for i, step in enumerate(range(11, 21)):  # an hour later: 9 steps in 18 s
        monitor.observe(step, 3.0, 0.5, t=3600.0 + 2.0 * i)
    expected = flops_per_token(GPT2_SMALL) * 32_768 * 18 / (27.0 * 312e12)
    assert monitor.snapshot()["mfu_avg"] == pytest.approx(expected)


def test_a_trainer_that_logs_no_dt_still_has_a_throughput_and_mfu():
    monitor = gpt2_monitor()
    for line in range(5):  # every 10th step logged, one line a second, no dt
        monitor.observe(10 * (line + 1), 3.0, None, t=float(line))
    snap = monitor.snapshot()
    assert snap["tokens_per_s"] == pytest.approx(10 * 32_768)
    assert snap["mfu_unknown_reason"] is None
    assert snap["mfu"] == pytest.approx(flops_per_token(GPT2_SMALL) * 10 * 32_768 / 312e12)
