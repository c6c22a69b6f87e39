"""The reference trainer on a real CUDA GPU, in a few minutes, as one table.

    python bench/gpu_check.py [--minutes N] [--out FILE] [--json FILE]

Measures the real trainer (`python -m trainwarden.trainer` as a subprocess, the way the
daemon runs it): gpt2-124m tokens/s and MFU eager and with --compile; the checkpoint
stall with asynchronous saves and with --sync-save; exact resume on CUDA through a
SIGTERM and a SIGKILL. In process: AdamW's foreach path against its per-parameter path
on the GPU, and the project's own NVML module (figures under load, XID events).

Each part has a share of --minutes (default 8) and is cut off when it runs out; a part
that fails or times out says so in its row and the others still run. Progress goes to
stderr, the table to stdout. Exit status 2, with one line, where there is no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script: this checkout's trainwarden and bench

from bench.gpu_figures import (  # noqa: E402
    Row,
    compare_losses,
    format_table,
    mfu,
    model_flops_per_token,
    part_budgets,
    percent,
    save_figures,
    save_row,
    step_lines,
    throughput,
)
from trainwarden.supervisor.contract import ENV_RESUME, expected_size  # noqa: E402
from trainwarden.trainer.presets import PRESETS, Preset  # noqa: E402

BIG = PRESETS["gpt2-124m"]
SMALL = PRESETS["tiny"]
WARMUP_STEPS = 5
TIMED_STEPS = 20
SAVES = 4
SAVE_EVERY = 4
RESUME_STEPS = 60
RESUME_SAVE_EVERY = 10
TERM_AT, KILL_AT = 25, 37
"""SIGTERM once step 25 is logged (the stop save commits 25), SIGKILL at 37 (the newest
committed checkpoint is then the scheduled one at 30, so 31.. are replayed)."""
PACE_S = "0.03"
"""Seconds the resume runs sleep after each step, so a signal lands near its step."""
ADAMW_STEPS = 10


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gpu_check: error: {message} (see bench/gpu_check.py --help)\n")


def _minutes(text: str) -> float:
    value = float(text)
    if not 0 < value <= 60:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 60, got {text}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = _Parser(prog="bench/gpu_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=_minutes, default=8.0, help="budget (default 8)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="also write the table here")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    return parser.parse_args(argv)


def progress(message: str) -> None:
    print(f"gpu_check: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- trainer runs


class TrainerRun:
    """One `python -m trainwarden.trainer` run: its lines, exit status, and whether it
    ran past its budget (then it was killed)."""

    def __init__(
        self,
        run_dir: Path,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        device: str = "cuda",
    ) -> None:
        self.run_dir = run_dir
        self.argv = [sys.executable, "-m", "trainwarden.trainer", "--run-dir", str(run_dir)]
        self.argv += [*args, "--device", device]
        self.env = _trainer_env(env)
        self.lines: list[str] = []
        self.returncode: int | None = None
        self.timed_out = False

    def run(self, budget_s: float, on_step: Callable[[int], int | None] | None = None) -> None:
        """Run to the end or the budget; `on_step(step)` may return a signal to send."""
        process = subprocess.Popen(
            self.argv,
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        timer = threading.Timer(budget_s, self._expire, (process,))
        timer.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                self.lines.append(line.rstrip("\n"))
                steps = step_lines(self.lines[-1:])
                if on_step is not None and steps:
                    signum = on_step(next(iter(steps)))
                    if signum is not None and process.poll() is None:
                        os.kill(process.pid, signum)
            self.returncode = process.wait()
        finally:
            timer.cancel()
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def _expire(self, process: subprocess.Popen[str]) -> None:
        if process.poll() is None:
            self.timed_out = True
            os.killpg(process.pid, signal.SIGKILL)

    def failure(self) -> str | None:
        """Why this run did not end well (None when it exited 0 in time)."""
        if self.timed_out:
            return "ran out of its time budget"
        if self.returncode != 0:
            tail = " / ".join(self.lines[-3:])
            return f"exit status {self.returncode}: {tail}"
        return None


def _trainer_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TRAINWARDEN_", "TRAINER_TEST_"))
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def newest_complete_checkpoint(run_dir: Path, n_params: int) -> Path | None:
    complete = [
        path
        for path in (run_dir / "checkpoints").glob("step_*.bin")
        if path.stat().st_size == expected_size(n_params)
    ]
    return max(complete, default=None, key=lambda path: path.name)


# ----------------------------------------------------------------------------- the parts


class Check:
    def __init__(
        self,
        minutes: float,
        scratch: Path,
        device: str = "cuda",
        big: Preset = BIG,
    ) -> None:
        self.budgets = part_budgets(minutes)
        self.scratch = scratch
        self.device = device
        """cuda; the parts also run on a CPU (its tests), with the tiny preset for `big`."""
        self.big = big
        self.rows: list[Row] = []
        self.figures: dict[str, Any] = {}
        self.gpu_name: str | None = None
        self.peak_tflops: float | None = None
        self.load_samples: list[Any] = []
        self.sampler: Any = None

    def part(self, name: str, body: Callable[[], None]) -> None:
        budget = self.budgets.get(name)
        progress(name if budget is None else f"{name} (budget {budget:.0f} s)")
        started = time.monotonic()
        try:
            body()
        except Exception as exc:  # one broken part must not hide the others' figures
            self.rows.append(Row(name, "failed", f"{type(exc).__name__}: {exc}"))
        self.figures.setdefault("part_s", {})[name] = round(time.monotonic() - started, 1)

    def gpu(self) -> None:
        import torch

        from trainwarden.supervisor.inputs.gpu import GpuSampler, shared_nvml
        from trainwarden.supervisor.shell.telemetry import peak_tflops_for

        cuda_name = torch.cuda.get_device_name(0)
        self.sampler = GpuSampler(_nvml_index(cuda_name), shared_nvml())
        self.gpu_name = self.sampler.name() or cuda_name
        self.peak_tflops = peak_tflops_for(self.gpu_name)
        driver = shared_nvml().call("nvmlSystemGetDriverVersion")
        peak = (
            f"{self.peak_tflops:g} TFLOP/s dense bf16 peak"
            if self.peak_tflops is not None
            else "not in the peak table: MFU unknown"
        )
        self.rows.append(
            Row(
                "GPU",
                self.gpu_name,
                f"{peak}; driver {driver}, torch {torch.__version__}, CUDA {torch.version.cuda}"
                f", NVML {'ok' if self.sampler.available else self.sampler.reason}",
            )
        )
        self.figures.update(gpu=self.gpu_name, peak_tflops=self.peak_tflops, driver=str(driver))

    def adamw(self) -> None:
        import torch

        from trainwarden.trainer.adamw import _float32
        from trainwarden.trainer.model import GPT
        from trainwarden.trainer.startup import build_optimizer

        device = torch.device(self.device)
        optimizers, params = [], []
        times: dict[bool, list[float]] = {}
        for foreach in (False, True):
            torch.manual_seed(0)
            model = GPT(self.big).to(device)
            optimizers.append(build_optimizer(model, self.big, foreach=foreach))
            params.append(list(model.parameters()))
        generator = torch.Generator(device).manual_seed(1)
        deadline = time.monotonic() + self.budgets["adamw"]
        steps = 0
        while steps < ADAMW_STEPS and time.monotonic() < deadline:
            for index, (a, b) in enumerate(zip(*params, strict=True)):
                # Scales from 1e-9 (where eps counts) to 10, as in the CPU test.
                scale = 10.0 ** (index % 6 * 2 - 9)
                grad = torch.randn(a.shape, device=device, generator=generator) * scale
                a.grad, b.grad = grad, grad.clone()
            for optimizer in optimizers:
                _synchronize(device)
                started = time.perf_counter()
                optimizer.step()
                _synchronize(device)
                times.setdefault(optimizer.foreach, []).append(time.perf_counter() - started)
            steps += 1
        differing = [
            float((a - b).abs().max())
            for a, b in zip(*params, strict=True)
            if not torch.equal(a, b)
        ]
        for a, b in zip(*params, strict=True):
            sa, sb = optimizers[0].state[a], optimizers[1].state[b]
            if not (
                torch.equal(sa.exp_avg, sb.exp_avg) and torch.equal(sa.exp_avg_sq, sb.exp_avg_sq)
            ):
                differing.append(float((sa.exp_avg_sq - sb.exp_avg_sq).abs().max()))
        per_param_ms = 1000 * statistics.median(times[False][1:] or times[False])
        foreach_ms = 1000 * statistics.median(times[True][1:] or times[True])
        result = "bit-identical" if not differing else f"differ: max |diff| {max(differing):.3g}"
        # The foreach path's one device-specific choice: how `tensor / scalar` rounds here.
        probe = torch.rand(1 << 20, device=device, generator=generator) + 0.5
        divisor = 3.0  # 1/3 is inexact in float32: dividing and multiplying by it differ
        reciprocal = _float32(1.0 / _float32(divisor))
        multiplies = torch.equal(probe / divisor, probe * reciprocal)
        self.rows.append(
            Row(
                "AdamW foreach vs per-parameter",
                result,
                f"{steps} steps of {self.big.name}; step {foreach_ms:.1f} ms foreach vs"
                f" {per_param_ms:.1f} ms per parameter; tensor / scalar here"
                f" {'multiplies by the reciprocal' if multiplies else 'divides'}",
            )
        )
        self.figures["adamw"] = {
            "bit_identical": not differing,
            "steps": steps,
            "foreach_ms": foreach_ms,
            "per_parameter_ms": per_param_ms,
            "scalar_division_multiplies": multiplies,
        }
        del optimizers, params
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def speed(self, part: str, extra: Sequence[str]) -> None:
        steps = WARMUP_STEPS + TIMED_STEPS
        run = TrainerRun(
            self.scratch / part,
            ["--preset", self.big.name, "--steps", str(steps), "--save-every", str(steps + 1)]
            + ["--eval-every", "0", "--sample-every", "0", *extra],
            device=self.device,
        )
        sampling = _LoadSampler(self.sampler) if part == "eager" and self.sampler else None
        try:
            run.run(self.budgets[part])
        finally:
            if sampling is not None:
                self.load_samples = sampling.stop()
        label = f"{self.big.name} tokens/s, {'--compile' if extra else 'eager'}"
        measured = throughput(step_lines(run.lines), self.big.tokens_per_step, WARMUP_STEPS)
        if measured is None:
            self.rows.append(Row(label, "not measured", run.failure() or "no timed step"))
            return
        utilisation = mfu(measured.tokens_per_s, model_flops_per_token(self.big), self.peak_tflops)
        failure = run.failure()
        self.rows.append(
            Row(
                label,
                f"{measured.tokens_per_s:,.0f} tokens/s, MFU {percent(utilisation)}",
                f"{measured.timed_steps} steps after {WARMUP_STEPS} warm-up, median step"
                f" {measured.median_step_s:.3f} s" + (f"; then {failure}" if failure else ""),
            )
        )
        self.figures[part] = {
            "tokens_per_s": measured.tokens_per_s,
            "mfu": utilisation,
            "median_step_s": measured.median_step_s,
            "timed_steps": measured.timed_steps,
        }

    def saves(self, part: str, extra: Sequence[str]) -> None:
        steps = SAVES * SAVE_EVERY
        run = TrainerRun(
            self.scratch / part,
            ["--preset", self.big.name, "--steps", str(steps), "--save-every", str(SAVE_EVERY)]
            + ["--eval-every", "0", "--sample-every", "0", *extra],
            device=self.device,
        )
        run.run(self.budgets[part])
        saves = save_figures(run.lines)
        size_mb = expected_size(self.big.n_params) / 1e6
        label = f"checkpoint stall, {'--sync-save' if extra else 'async'}"
        row = save_row(label, saves, size_mb)
        failure = run.failure()
        self.rows.append(
            Row(row.check, row.result, row.detail + (f"; {failure}" if failure else ""))
        )
        self.figures[part] = [{"stall_s": s.stall_s, "write_s": s.write_s} for s in saves]
        shutil.rmtree(run.run_dir, ignore_errors=True)  # 1.5 GB per checkpoint

    def resume(self) -> None:
        deadline = time.monotonic() + self.budgets["resume"]

        def budget() -> float:
            return max(1.0, deadline - time.monotonic())

        args = ["--preset", SMALL.name, "--steps", str(RESUME_STEPS)]
        args += ["--save-every", str(RESUME_SAVE_EVERY)]
        paced = {"TRAINER_TEST_STEP_SLEEP_S": PACE_S}
        straight = TrainerRun(self.scratch / "straight", args, paced, self.device)
        straight.run(budget())
        if (why := straight.failure()) is not None:
            raise RuntimeError(f"the straight run failed: {why}")

        run_dir = self.scratch / "interrupted"
        segments = [TrainerRun(run_dir, args, paced, self.device)]
        segments[0].run(budget(), lambda step: signal.SIGTERM if step == TERM_AT else None)
        if segments[0].returncode != 0:
            raise RuntimeError(f"SIGTERM: {segments[0].failure()}")
        for on_step in (lambda step: signal.SIGKILL if step == KILL_AT else None, None):
            resume_from = newest_complete_checkpoint(run_dir, SMALL.n_params)
            if resume_from is None:
                raise RuntimeError("no complete checkpoint to resume from")
            env = {**paced, ENV_RESUME: str(resume_from)}
            segment = TrainerRun(run_dir, args, env, self.device)
            segment.run(budget(), on_step)
            segments.append(segment)
        killed, last = segments[1], segments[2]
        if killed.returncode != -signal.SIGKILL:
            raise RuntimeError(f"the SIGKILL run ended otherwise: {killed.failure()}")
        if (why := last.failure()) is not None:
            raise RuntimeError(f"the last resumed run failed: {why}")

        reference = {step: line.loss for step, line in step_lines(straight.lines).items()}
        logged = [
            (step, line.loss)
            for segment in segments
            for step, line in _all_step_lines(segment.lines)
        ]
        replayed = len(logged) - len({step for step, _ in logged})
        comparison = compare_losses(reference, logged)
        weights = _weights_difference(
            newest_complete_checkpoint(straight.run_dir, SMALL.n_params),
            newest_complete_checkpoint(run_dir, SMALL.n_params),
        )
        self.rows.append(
            Row(
                f"exact resume on {self.device} (SIGTERM, SIGKILL)",
                comparison.text(),
                f"{SMALL.name} preset, {comparison.compared} steps compared ({replayed} replayed"
                f" after the SIGKILL at {KILL_AT}); final weights {weights}",
            )
        )
        self.figures["resume"] = {
            "exact": comparison.exact,
            "max_abs_loss_diff": comparison.max_abs_diff,
            "compared": comparison.compared,
            "final_weights": weights,
        }

    def nvml(self) -> None:
        from trainwarden.supervisor.inputs.gpu import NA, shared_nvml
        from trainwarden.supervisor.inputs.gpu_events import GpuEventWatcher

        if self.sampler is None:
            raise RuntimeError("no GPU sampler (the gpu part failed)")

        samples = self.load_samples or [self.sampler.sample()]
        busiest = [s for s in samples if s is not None and s.util_percent is not NA]
        sample = max(busiest, key=lambda s: s.util_percent) if busiest else samples[-1]
        if sample is None:
            self.rows.append(Row("NVML sample", "failed", self.sampler.reason or "no sample"))
        else:
            seen = (s.throttle_reasons for s in samples if s is not None)
            reasons = sorted({r for rs in seen if rs is not NA for r in rs})
            missing = [key for key, value in sample._asdict().items() if value is NA]
            self.rows.append(
                Row(
                    "NVML under load" if self.load_samples else "NVML sample",
                    "ok" if not missing else f"N/A: {', '.join(missing)}",
                    f"util {sample.util_percent} %, memory {_gib(sample.mem_used_bytes)} of"
                    f" {_gib(sample.mem_total_bytes)} GiB, power {sample.power_w} W of"
                    f" {sample.power_limit_w} W, {sample.temperature_c} C, SM"
                    f" {sample.sm_clock_mhz} MHz, throttle reasons seen"
                    f" {', '.join(reasons) or 'none'} ({len(self.load_samples)} samples)",
                )
            )
            self.figures["nvml"] = {**sample.to_dict(), "throttle_reasons_seen": reasons}
        watcher = GpuEventWatcher(shared_nvml(), lambda *_: None, lambda *_: None, wait_ms=200)
        watcher.start()
        watcher.ready.wait(10)
        watcher.stop()
        if watcher.watching:
            result, detail = "supported", f"XID events registered on GPU {watcher.watching}"
        else:
            result = "not supported"
            detail = "; ".join(f"GPU {i}: {why}" for i, why in watcher.without_events.items())
        self.rows.append(Row("NVML XID events", result, detail or "NVML unusable"))
        self.figures["xid_events"] = watcher.watching


class _LoadSampler:
    """GpuSampler.sample() every second in a thread, while a trainer runs."""

    def __init__(self, sampler: Any) -> None:
        self._sampler = sampler
        self._samples: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            sample = self._sampler.sample()
            if sample is not None:
                self._samples.append(sample)

    def stop(self) -> list[Any]:
        self._stop.set()
        self._thread.join(5)
        return self._samples


def _nvml_index(cuda_name: str) -> int:
    """NVML's index of the GPU CUDA calls 0 (the orders differ on multi-GPU machines)."""
    from trainwarden.supervisor.inputs.gpu import shared_nvml

    nvml = shared_nvml()
    module = nvml.module()
    if module is None:
        return 0
    count = nvml.call("nvmlDeviceGetCount")
    for index in range(int(count) if isinstance(count, int) else 0):
        handle, _ = nvml.handle(index)
        name = nvml.call("nvmlDeviceGetName", handle) if handle is not None else None
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        if name == cuda_name:
            return index
    return 0


def _all_step_lines(lines: Sequence[str]) -> list[tuple[int, Any]]:
    return [(step, line) for text in lines for step, line in step_lines([text]).items()]


def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gib(value: Any) -> str:
    return f"{value / 2**30:.1f}" if isinstance(value, int) else str(value)


def _weights_difference(a: Path | None, b: Path | None) -> str:
    if a is None or b is None or a.name != b.name:
        return f"not compared ({a and a.name} vs {b and b.name})"
    if a.read_bytes() == b.read_bytes():
        return "byte-identical"
    import torch

    header = 8
    x = torch.frombuffer(bytearray(a.read_bytes()[header:]), dtype=torch.float32)
    y = torch.frombuffer(bytearray(b.read_bytes()[header:]), dtype=torch.float32)
    return f"differ (max |diff| {float((x - y).abs().max()):.3g})"


# ----------------------------------------------------------------------------- main


def cuda_missing() -> str | None:
    """Why this machine cannot run the check, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'trainwarden[trainer]')"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__} sees none): nothing to measure"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reason = cuda_missing()
    if reason is not None:
        print(f"gpu_check: {reason}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_check.") as scratch:
        check = Check(args.minutes, Path(scratch))
        check.part("gpu", check.gpu)
        check.part("adamw", check.adamw)
        check.part("eager", lambda: check.speed("eager", []))
        check.part("compile", lambda: check.speed("compile", ["--compile"]))
        check.part("save-async", lambda: check.saves("save-async", []))
        check.part("save-sync", lambda: check.saves("save-sync", ["--sync-save"]))
        check.part("resume", check.resume)
        check.part("nvml", check.nvml)
    table = format_table(check.rows)
    took = time.monotonic() - started
    print(table)
    if args.out is not None:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        args.out.write_text(
            f"GPU check on {check.gpu_name}, {when}, took {took:.0f} s"
            f" (`python bench/gpu_check.py --minutes {args.minutes:g}`):\n\n{table}\n"
        )
    if args.json is not None:
        check.figures["took_s"] = round(took, 1)
        check.figures["rows"] = [row.__dict__ for row in check.rows]
        args.json.write_text(json.dumps(check.figures, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
