"""Time from launching the TUI to its first complete frame, on a 200,000-step run.

    .venv/bin/python bench/bench_tui.py [--steps 200000] [--runs 5] [--no-tmux]

Builds a run directory with a 200,000-step .loss.json, three checkpoints, bandit state,
samples and a journal, starts a real daemon on it (its trainer just sleeps), then launches
the TUI in a fresh process several times and reports, per launch, the time until every
panel holds data and has been drawn. Two measurements:

- headless: `TrainwardenApp` in a child process, from spawning it to the frame in which
  the model first counts as populated (Python start-up and imports included);
- terminal: `python -m trainwarden.tui` in a 160x48 tmux pane, from spawning it to the pane showing
  the run's last step, its newest checkpoint and the bandit's arms (what a person sees).

Target (DESIGN.md section 8): under 1.5 s.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from tests.support import make_run  # noqa: E402
from trainwarden.supervisor.cli.detach import start_detached  # noqa: E402
from trainwarden.supervisor.cli.start_checks import load_for_start  # noqa: E402
from trainwarden.supervisor.protocol import Client  # noqa: E402

TARGET_S = 1.5
N_PARAMS = 1000
HEADLESS_CHILD = """
import sys, time
from pathlib import Path
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.source import DaemonSource

async def wait_for_frame(pilot):
    app = pilot.app
    while app.first_complete_frame_s is None:
        await pilot.pause(0.005)
    await pilot.pause()
    print(f"FRAME {time.time():.6f}", flush=True)
    app.exit(0)

app = TrainwardenApp(DaemonSource(Path(sys.argv[1])))
app.run(headless=True, size=(160, 48), auto_pilot=wait_for_frame)
"""


def build_run(run_dir: Path, steps: int) -> None:
    make_run(
        run_dir,
        [sys.executable, "-c", "import time; time.sleep(3600)"],
        run={"name": "bench-200k"},
        trainer={"stop_timeout_s": 5.0, "total_steps": steps + 50_000},
        telemetry={"vocab_size": 50257},
    )
    t0 = time.time() - steps * 0.25
    with open(run_dir / ".loss.json", "wb") as f:
        for step in range(1, steps + 1):
            loss = 3.0 + 7.8 * math.exp(-step / 8000) + 0.05 * math.sin(step / 50)
            f.write(
                orjson.dumps(
                    {
                        "step": step,
                        "loss": round(loss, 5),
                        "dt": 0.25,
                        "t": t0 + step * 0.25,
                        "seg": 1,
                    }
                )
                + b"\n"
            )
    ckpt_dir = run_dir / "checkpoints"
    ckpt_dir.mkdir()
    for step in (steps - 2000, steps - 1000, steps):
        body = struct.pack("<ii", step, N_PARAMS) + bytes(12 * N_PARAMS)
        (ckpt_dir / f"step_{step:06d}.bin").write_bytes(body)
    arms = {
        name: {"pulls": steps // 3, "ema_reward": 0.5, "prob": 1 / 3, "cap": 1.0, "floor": 0.0}
        for name in ("docs", "code", "tests")
    }
    state = {"step": steps, "arms": arms, "zombies": [], "policy": {}, "phase": {"pivots": 0}}
    (run_dir / ".state.json").write_bytes(orjson.dumps(state))
    samples = [
        {"step": steps, "arm": name, "text": f"a {name} sample", "t": time.time()} for name in arms
    ]
    (run_dir / ".samples.json").write_bytes(orjson.dumps({"samples": samples}))


def headless_launch(socket_path: Path) -> float:
    started = time.time()
    child = subprocess.Popen(
        [sys.executable, "-c", HEADLESS_CHILD, str(socket_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        for line in child.stdout:  # type: ignore[union-attr]
            if line.startswith("FRAME "):
                return float(line.split()[1]) - started
        raise RuntimeError(f"the TUI exited without a frame: {child.stderr.read()}")  # type: ignore[union-attr]
    finally:
        child.wait(30)


def terminal_launch(socket_path: Path, last_step: int, newest_checkpoint: int) -> float:
    server = f"trainwarden-bench-{uuid.uuid4().hex[:8]}"
    wanted = (f"{last_step:,}", f"{newest_checkpoint:,}", "docs", "tests", "ln V", "daemon_start")
    started = time.time()
    subprocess.run(
        [
            "tmux",
            "-L",
            server,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "48",
            sys.executable,
            "-m",
            "trainwarden.tui",
            "--socket",
            str(socket_path),
        ],
        check=True,
        env={**os.environ, "TERM": "xterm-256color"},
        cwd=ROOT,
    )
    try:
        while time.time() - started < 30:
            screen = subprocess.run(
                ["tmux", "-L", server, "capture-pane", "-p"], capture_output=True, text=True
            ).stdout
            if all(text in screen for text in wanted):
                return time.time() - started
            time.sleep(0.01)
        raise RuntimeError(f"the panels never filled:\n{screen}")
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True)


def report(label: str, figures: list[float]) -> None:
    verdict = "ok" if max(figures) < TARGET_S else "OVER TARGET"
    print(
        f"{label:<34} median {statistics.median(figures):.3f} s  "
        f"min {min(figures):.3f} s  max {max(figures):.3f} s  "
        f"({len(figures)} launches; target < {TARGET_S} s: {verdict})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-tmux", action="store_true", help="skip the terminal measurement")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-tui-") as tmp:
        run_dir = Path(tmp) / "run"
        t = time.perf_counter()
        build_run(run_dir, args.steps)
        print(f"built a {args.steps:,}-step run in {time.perf_counter() - t:.1f} s")
        cfg = load_for_start(run_dir)
        t = time.perf_counter()
        daemon_pid = start_detached(cfg)
        print(f"daemon answering after {time.perf_counter() - t:.3f} s (pid {daemon_pid})")
        try:
            # Let the daemon take its first GPU/host/bandit samples, as a long-running one has.
            time.sleep(2.5)
            with Client(cfg.socket_path) as client:
                t = time.perf_counter()
                history = client.request("history", points=300)
                query_s = time.perf_counter() - t
            print(
                f"history query, {history['count']:,} steps -> 300 points: {query_s * 1000:.1f} ms"
            )
            headless = [headless_launch(cfg.socket_path) for _ in range(args.runs)]
            report("first complete frame (headless)", headless)
            if shutil.which("tmux") and not args.no_tmux:
                terminal = [
                    terminal_launch(cfg.socket_path, args.steps, args.steps)
                    for _ in range(args.runs)
                ]
                report("first complete frame (tmux 160x48)", terminal)
            else:
                print("terminal measurement skipped (no tmux, or --no-tmux)")
        finally:
            with Client(cfg.socket_path, timeout=None) as client:
                client.request("shutdown")
            deadline = time.monotonic() + 30
            while (
                run_dir / ".trainwarden" / "daemon.pid"
            ).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
