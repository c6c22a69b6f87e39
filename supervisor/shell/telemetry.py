"""Per-step training telemetry: throughput, MFU, loss averages, pace and ETA.

Pure computation: the daemon feeds each parsed step (with the wall-clock time it saw the
line) to a Monitor and publishes `snapshot()`. No clocks, files or GPU calls here; the
GPU's NVML name and the checkpoint header's parameter count arrive through setters.

Every rate is on the wall clock: steps/min, tokens/s and MFU over the window's span
between step lines, mfu_avg over the spans of every trainer start. The trainer's own step
time (dt) leaves out what it does between its timers (data loading, logging, a save), so a
rate from it would disagree with the pace one line beside it shows. tokens/s is therefore
steps/min / 60 x tokens per step, and MFU (model FLOPs utilisation) = flops_per_token x
tokens/s / peak FLOP/s, with flops_per_token = 6N (+ 12 x n_layer x seq_len x d_model when
the attention shape is known). An unknown input makes MFU None with a reason, never a
guessed number.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from trainwarden.supervisor.protocol import StepFigures

ETA_WINDOW_S = 300.0
"""Seconds of this segment's steps the ETA's rate is taken over. The 20-step window that
gives steps/min and tokens/s follows every hiccup of a busy machine (an ETA from it jumped
1h 25m -> 54m within 20 s); over five minutes a burst of slow or fast steps moves the
rate, and the ETA, by a few percent at most."""
ETA_MIN_S = 10.0
"""No ETA until this segment's steps span this long: a rate from its first few steps
(the trainer warming up, a resumed start's first batches) is no rate to promise a date by."""
ETA_SAMPLE_S = 1.0
"""At most one (time, step) sample a second is kept for that rate: a bounded deque of
about ETA_WINDOW_S entries however fast the trainer logs."""

PEAK_TFLOPS: dict[str, float] = {
    "RTX 4090": 165.2,
    "RTX 3090": 71.0,
    "A100": 312.0,
    "H100 SXM": 989.0,
    "H100 PCIe": 756.0,
    "H200": 989.0,
    "L40S": 362.0,
}
"""Dense bf16/fp16 tensor-core peak with fp32 accumulate, TFLOP/s, by canonical GPU name."""

# Words in NVML names that say nothing about the chip's compute: vendor and brand
# prefixes, memory size and type, and the SXM socket generation.
_NOISE = re.compile(r"^(NVIDIA|GEFORCE|TESLA|\d+GB|HBM\d*E?|SXM\d*)$")


def canonical_gpu(gpu_name: str) -> str | None:
    """The PEAK_TFLOPS key for an NVML device name, or None when not in the table.

    Matching is on whole words, so a close relative with a different peak (RTX 4090 D,
    RTX 3090 Ti, a laptop part, H100 NVL, L40 without the S) is unknown, not mistaken.
    """
    words = re.split(r"[\s\-_/]+", gpu_name.upper().strip())
    is_pcie = "PCIE" in words
    words = [w for w in words if w and w != "PCIE" and not _NOISE.match(w)]
    if words == ["RTX", "4090"]:
        return "RTX 4090"
    if words == ["RTX", "3090"]:
        return "RTX 3090"
    if words == ["A100"]:
        return "A100"  # SXM4 and PCIe A100s share the 312 TFLOP/s dense bf16 peak
    if words == ["H100"]:
        return "H100 PCIe" if is_pcie else "H100 SXM"
    if words == ["H200"]:
        return "H200"
    if words == ["L40S"]:
        return "L40S"
    return None


def peak_tflops_for(gpu_name: str) -> float | None:
    """Peak dense bf16 TFLOP/s for an NVML name ("NVIDIA GeForce RTX 4090"), None if unknown."""
    key = canonical_gpu(gpu_name)
    return None if key is None else PEAK_TFLOPS[key]


def flops_per_token(n_params: int, attention: Mapping[str, int] | None = None) -> float:
    """Training FLOPs per token: 6N, plus 12 x n_layer x seq_len x d_model for attention."""
    flops = 6.0 * n_params
    if attention:
        flops += 12.0 * attention["n_layer"] * attention["seq_len"] * attention["d_model"]
    return flops


GPU_NOT_YET_REASON = 'GPU not identified yet (peak_tflops = "auto")'


class _Step(NamedTuple):
    step: int
    loss: float
    dt_s: float | None
    t_s: float
    tokens: int | None


@dataclass(frozen=True, slots=True)
class MonitorSettings:
    """What a Monitor needs to know besides the steps themselves."""

    window: int = 20
    """Step lines in the rolling window (steps/min, tokens/s and MFU over its wall-clock
    span; the loss moving average)."""
    tokens_per_step: int | None = None
    """Tokens per optimisation step when the step line does not say (extras 'tokens')."""
    n_params: int | None = None
    """Model parameters N, None until known."""
    attention: Mapping[str, int] | None = None
    """{n_layer, seq_len, d_model}, adding the attention FLOPs to 6N."""
    peak_tflops: float | None = None
    """Accelerator peak TFLOP/s, None until known."""
    peak_unknown_reason: str | None = GPU_NOT_YET_REASON
    """Why peak_tflops is None (shown in place of MFU)."""
    total_steps: int | None = None
    """Planned steps, for the ETA."""
    ema_beta: float = 0.98
    """Smoothing of the loss EMA."""
    vocab_size: int | None = None
    """Vocabulary size V; ln(V) is the loss of a uniform guess (the collapse reference)."""


def no_gpu_reason() -> str:
    return "no NVIDIA GPU: set [telemetry] peak_tflops"


def unknown_gpu_reason(gpu_name: str) -> str:
    return f"unknown GPU '{gpu_name}': set [telemetry] peak_tflops"


def grad_norm_of(extras: Mapping[str, Any]) -> float | None:
    """The step line's `grad_norm` extra (llm.c's `norm`) as a finite number, for spike
    detection; None when it has none."""
    value = extras.get("grad_norm", extras.get("norm"))
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def tokens_from_extras(extras: Mapping[str, Any]) -> int | None:
    """The step's token count when the trainer printed one (`tokens: 32768`)."""
    tokens = extras.get("tokens")
    if isinstance(tokens, float) and tokens.is_integer():
        tokens = int(tokens)
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        return tokens
    return None


class Monitor:
    """Rolling and run-long statistics over the steps of a run.

    observe() is O(1) and the window keeps `window` steps, so memory stays bounded over a
    multi-week run; snapshot() is O(window). Each trainer start (new_segment), and a step
    number at or below the previous one, starts a fresh window: pace and throughput across
    a restart or a stop would count the time the trainer was not running as training time.
    Run-long sums and the EMA carry on; the run-long wall-clock time adds only the spans
    between two lines of the same start.
    """

    def __init__(self, settings: MonitorSettings | None = None) -> None:
        self.settings = settings or MonitorSettings()
        if self.settings.window < 1:
            raise ValueError(f"window must be >= 1, got {self.settings.window}")
        self._n_params = self.settings.n_params
        self._peak_tflops = self.settings.peak_tflops
        self._peak_reason = None if self._peak_tflops else self.settings.peak_unknown_reason
        self._recent: deque[_Step] = deque(maxlen=self.settings.window)
        self._ema = 0.0
        self._ema_weight = (
            0.0  # 1 - beta^n: bias correction, so early EMA values are not pulled to 0
        )
        self._run_tokens = 0
        """Tokens of the steps between two lines of the same start, over the run."""
        self._run_s = 0.0
        """Wall-clock seconds those steps took, between their lines."""
        self._pace: deque[tuple[float, int]] = deque()
        """(t, step) of this segment, one a second at most, over the last ETA_WINDOW_S."""

    def new_segment(self) -> None:
        """A trainer starts: its pace is its own (a start resumed at the step the last one
        stopped at continues the step numbers, but not the clock)."""
        self._recent.clear()
        self._pace.clear()

    def set_n_params(self, n_params: int | None) -> None:
        self._n_params = n_params if n_params and n_params > 0 else None

    def set_peak_tflops(self, peak_tflops: float | None, reason: str | None = None) -> None:
        """A known peak, or None with the reason MFU cannot be computed."""
        if peak_tflops is not None and peak_tflops > 0:
            self._peak_tflops, self._peak_reason = peak_tflops, None
        else:
            self._peak_tflops = None
            self._peak_reason = reason or "peak TFLOP/s unknown: set [telemetry] peak_tflops"

    def set_gpu_name(self, gpu_name: str | None) -> None:
        """Look the peak up from the GPU's NVML name (None: no NVIDIA GPU)."""
        if gpu_name is None:
            self.set_peak_tflops(None, no_gpu_reason())
        else:
            self.set_peak_tflops(peak_tflops_for(gpu_name), unknown_gpu_reason(gpu_name))

    @property
    def flops_per_token(self) -> float | None:
        if self._n_params is None:
            return None
        return flops_per_token(self._n_params, self.settings.attention)

    def observe(
        self, step: int, loss: float, dt: float | None, t: float, tokens: int | None = None
    ) -> None:
        """One logged step: loss, its duration dt (s), wall-clock t (s) when it was seen."""
        if tokens is None:
            tokens = self.settings.tokens_per_step
        if dt is not None and not (math.isfinite(dt) and dt > 0):
            dt = None
        if self._recent and step <= self._recent[-1].step:
            self._recent.clear()
            self._pace.clear()
        if self._recent and tokens:
            previous = self._recent[-1]
            if t > previous.t_s:
                self._run_tokens += tokens * (step - previous.step)
                self._run_s += t - previous.t_s
        self._recent.append(_Step(step, loss, dt, t, tokens))
        self._note_pace(t, step)
        if math.isfinite(loss):
            # A non-finite loss is reported as the step's loss but kept out of the
            # averages, which would otherwise stay nan for the rest of the run.
            beta = self.settings.ema_beta
            self._ema = beta * self._ema + (1.0 - beta) * loss
            self._ema_weight = beta * self._ema_weight + (1.0 - beta)

    def observe_record(self, record: Any, t: float) -> None:
        """observe() from a StepRecord, taking tokens from its extras when present."""
        self.observe(record.step, record.loss, record.dt, t, tokens_from_extras(record.extras))

    def _mfu_reason(self, last: _Step | None) -> str | None:
        if self._peak_tflops is None:
            return self._peak_reason
        if self._n_params is None:
            return "n_params unknown: set [telemetry] n_params"
        tokens = last.tokens if last else self.settings.tokens_per_step
        if not tokens:
            return "tokens per step unknown: set [telemetry] tokens_per_step"
        return None

    def _mfu(self, tokens: float, seconds: float) -> float | None:
        flops = self.flops_per_token
        if flops is None or self._peak_tflops is None or seconds <= 0:
            return None
        return flops * tokens / (seconds * self._peak_tflops * 1e12)

    def _note_pace(self, t: float, step: int) -> None:
        pace = self._pace
        if len(pace) > 1 and t - pace[-2][0] < ETA_SAMPLE_S:
            pace[-1] = (t, step)  # the newest sample moves with the newest step
            return
        pace.append((t, step))
        # Keep one sample at or before the window's start, so the span is the full window.
        while len(pace) > 2 and pace[1][0] <= t - ETA_WINDOW_S:
            pace.popleft()

    def eta_steps_per_s(self) -> float | None:
        """Steps per second over the last ETA_WINDOW_S of this segment (less while the
        segment is younger), the rate the ETA divides by; None before its steps span
        ETA_MIN_S."""
        if len(self._pace) < 2:
            return None
        (t0, s0), (t1, s1) = self._pace[0], self._pace[-1]
        if t1 - t0 < ETA_MIN_S or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)

    def _window_span_s(self) -> float | None:
        """Wall-clock seconds between the window's first and last line (None: under two
        lines, or no time between them)."""
        if len(self._recent) < 2:
            return None
        elapsed_s = self._recent[-1].t_s - self._recent[0].t_s
        return elapsed_s if elapsed_s > 0 else None

    def _steps_per_min(self) -> float | None:
        span_s = self._window_span_s()
        if span_s is None:
            return None
        # Step numbers, not line counts: a trainer that logs every k-th step still paces right.
        return (self._recent[-1].step - self._recent[0].step) * 60.0 / span_s

    def _tokens_per_s(self) -> float | None:
        """Tokens of the steps after the window's first line over its span: the steps
        each line advances by times that line's tokens per step (None: a line without)."""
        span_s = self._window_span_s()
        if span_s is None:
            return None
        steps = list(self._recent)
        tokens = 0
        for before, line in zip(steps, steps[1:], strict=False):
            if not line.tokens:
                return None
            tokens += line.tokens * (line.step - before.step)
        return tokens / span_s

    def snapshot(self) -> StepFigures:
        """The figures of the latest step (all None before the first one)."""
        last = self._recent[-1] if self._recent else None
        finite_losses = [s.loss for s in self._recent if math.isfinite(s.loss)]
        tokens_per_s = self._tokens_per_s()
        reason = self._mfu_reason(last)
        mfu = self._mfu(tokens_per_s, 1.0) if reason is None and tokens_per_s else None
        mfu_avg = self._mfu(self._run_tokens, self._run_s) if self._run_s > 0 else None

        steps_per_min = self._steps_per_min()
        eta_s = None
        total = self.settings.total_steps
        rate = self.eta_steps_per_s()
        if last is not None and total is not None:
            remaining = max(total - last.step, 0)
            if remaining == 0:
                eta_s = 0.0
            elif rate:
                eta_s = remaining / rate
        vocab = self.settings.vocab_size
        return {
            "step": last.step if last else None,
            "loss": last.loss if last else None,
            "loss_ema": self._ema / self._ema_weight if self._ema_weight > 0 else None,
            "loss_avg": math.fsum(finite_losses) / len(finite_losses) if finite_losses else None,
            "dt": last.dt_s if last else None,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu,
            "mfu_avg": mfu_avg,
            "mfu_unknown_reason": reason,
            "steps_per_min": steps_per_min,
            "eta_s": eta_s,
            "collapse_loss": math.log(vocab) if vocab and vocab > 1 else None,
        }


def settings_from_config(
    telemetry: Any, total_steps: int | None = None, gpu_name: str | None = None
) -> MonitorSettings:
    """MonitorSettings from a TelemetryConfig; "auto" fields stay unknown until a setter.

    `gpu_name` is the NVML name when already known; None means not known yet (the GPU
    sampler then calls set_gpu_name with the name, or with None when there is no GPU).
    """
    n_params = telemetry.n_params if isinstance(telemetry.n_params, int) else None
    peak: float | None
    if isinstance(telemetry.peak_tflops, int | float):
        peak, reason = float(telemetry.peak_tflops), None
    elif gpu_name is not None:
        peak, reason = peak_tflops_for(gpu_name), unknown_gpu_reason(gpu_name)
    else:
        peak, reason = None, GPU_NOT_YET_REASON
    return MonitorSettings(
        window=telemetry.window,
        tokens_per_step=telemetry.tokens_per_step,
        n_params=n_params,
        attention=dict(telemetry.attention) or None,
        peak_tflops=peak,
        peak_unknown_reason=reason,
        total_steps=total_steps,
        ema_beta=telemetry.ema_beta,
        vocab_size=telemetry.vocab_size,
    )
