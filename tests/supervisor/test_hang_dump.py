"""A stack dump before a hung trainer is killed: the policy's timing (the SIGTERM waits for
the dump, never past dump_timeout_s), and a real daemon dumping a trainer stuck in a known
function with py-spy (or journaling why it could not), then `trainwarden dump` on demand."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.daemon import running_daemon
from tests.support.policy import decide_all
from tests.support.procs import pid_alive
from tests.support.runs import PYTHON, journal, make_run
from tests.support.wait import wait_for
from trainwarden.supervisor.core import policy as p
from trainwarden.supervisor.inputs.stacks import ProcessStacks, StackDump, capture
from trainwarden.supervisor.store.hangs import dump_path, hangs_dir, write_dump
from trainwarden.supervisor.store.rundir import RunFiles

RULES = p.Rules(stall_timeout_s=60.0, stop_timeout_s=10.0, dump_timeout_s=5.0)


def run(events: list[object], state: p.State | None = None, rules: p.Rules = RULES):
    return decide_all(events, state, rules)


def hung(rules: p.Rules = RULES) -> tuple[p.State, list[object]]:
    """A trainer (pid 100) that logged step 1 at t=1 and nothing since, at t=61."""
    return run(
        [p.Startup(0.0), p.TrainerSpawned(0.0, 100), p.StepLogged(1.0, 1, 3.0), p.Tick(61.0)],
        rules=rules,
    )


def signals(actions: list[object]) -> list[str]:
    return [a.signal for a in actions if isinstance(a, p.SignalTrainer)]


# ------------------------------------------------------------------ the policy


def test_a_hang_asks_for_a_dump_and_sends_sigterm_once_it_is_done():
    state, actions = hung()
    (dump,) = [a for a in actions if isinstance(a, p.DumpStacks)]
    assert (dump.pid, dump.step, dump.timeout_s) == (100, 1, 5.0)
    assert signals(actions) == []
    assert state.phase == "stopping" and state.stop_reason == "stall"
    assert p.deadline(state, RULES) == 66.0
    state, actions = run([p.StacksDumped(62.5, 100)], state)
    assert signals(actions) == ["SIGTERM"]
    assert state.kill_at == 62.5 + RULES.stop_timeout_s and state.dump_until is None


def test_a_dump_that_overruns_does_not_hold_the_sigterm_back():
    state, _ = hung()
    state, actions = run([p.Tick(65.9)], state)
    assert signals(actions) == []
    state, actions = run([p.Tick(66.0)], state)
    assert signals(actions) == ["SIGTERM"]
    state, late = run([p.StacksDumped(67.0, 100)], state)
    assert signals(late) == [] and state.kill_at == 76.0


def test_no_dump_when_dump_timeout_is_zero():
    _, actions = hung(p.Rules(stall_timeout_s=60.0, stop_timeout_s=10.0, dump_timeout_s=0.0))
    assert not [a for a in actions if isinstance(a, p.DumpStacks)]
    assert signals(actions) == ["SIGTERM"]


def test_shutdown_during_a_dump_stops_the_trainer_at_once():
    state, _ = hung()
    state, actions = run([p.ShutdownRequested(62.0, "SIGTERM")], state)
    assert signals(actions) == ["SIGTERM"]
    assert state.stop_reason == "shutdown" and state.dump_until is None


def test_an_operator_shutdown_during_a_dump_stops_the_trainer_at_once():
    state, _ = hung()
    handles = frozenset({"SIGTERM", "SIGUSR1"})
    state, actions = run([p.Operator(62.0, 7, p.Shutdown(), handles=handles)], state)
    assert signals(actions) == ["SIGTERM"]
    assert state.stop_reason == "shutdown" and state.dump_until is None
    assert [w.kind for w in state.waiters] == ["stop"]


def test_a_trainer_that_exits_during_the_dump_is_a_hang_crash_and_is_restarted():
    state, _ = hung()
    state, actions = run([p.TrainerExited(62.0, 100, 1), p.StacksDumped(62.1, 100)], state)
    (crash,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "crash"]
    assert crash.fields["cause"] == "hang (no step line)"
    assert state.dump_until is None and signals(actions) == []


# ------------------------------------------------------------------ a real daemon

STUCK_TRAINER = """\
import sys, time

def stuck_in_data_loader():
    open("stuck", "w").close()
    while True:
        time.sleep(60)

for step in range(1, 4):
    time.sleep(0.1)
    print(f"step: {step}, loss: {3.0 - step * 0.1:.2f}, dt: 0.1", flush=True)
    with open("last_step_t", "w") as f:
        f.write(repr(time.time()))
stuck_in_data_loader()
"""


def stuck_run(run_dir: Path, **restart: object) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "stuck.py").write_text(STUCK_TRAINER)
    return make_run(
        run_dir,
        [PYTHON, "stuck.py"],
        trainer={"stop_timeout_s": 5.0},
        restart={"backoff_initial_s": 30.0, **restart},
    )


def first(run_dir: Path, kind: str, **match: object) -> dict | None:
    for record in journal(run_dir):
        if record["kind"] == kind and all(record.get(k) == v for k, v in match.items()):
            return record
    return None


def test_a_hung_trainer_is_dumped_naming_its_function_then_killed_on_time(tmp_path: Path):
    stall_s, dump_s = 3.0, 8.0
    run_dir = stuck_run(tmp_path / "run", stall_timeout_s=stall_s, dump_timeout_s=dump_s)
    with running_daemon(run_dir):
        crash = wait_for(lambda: first(run_dir, "crash"), 60, what="the hang's kill")
        dumped = first(run_dir, "hang_dump")
        sigterm = first(run_dir, "signal", signal="SIGTERM")
        assert dumped is not None and sigterm is not None
        assert dumped["error"] is None and dumped["reason"] == "hang" and dumped["step"] == 3
        assert dumped["top_frames"][0].startswith("stuck_in_data_loader (stuck.py:")
        text = Path(dumped["path"]).read_text()
        assert "stuck_in_data_loader" in text and "wchan" in text
        assert Path(dumped["path"]).parent == run_dir / ".trainwarden" / "hangs"
        assert Path(dumped["path"]).name.endswith("-step3.txt")
        # Dumped before it was signalled, and it died of that signal.
        assert dumped["t"] <= sigterm["t"] <= crash["t"]
        assert crash["cause"] == "hang (no step line)"
        # Not later than stall_timeout_s + dump_timeout_s after its last step line.
        last_step_t = float((run_dir / "last_step_t").read_text())
        assert sigterm["t"] - last_step_t <= stall_s + dump_s + 2.0


def test_without_py_spy_the_reason_is_journaled_and_the_kill_is_on_time(tmp_path: Path):
    stall_s, dump_s = 3.0, 8.0
    run_dir = stuck_run(
        tmp_path / "run",
        stall_timeout_s=stall_s,
        dump_timeout_s=dump_s,
        py_spy=str(tmp_path / "no-such-py-spy"),
    )
    with running_daemon(run_dir):
        crash = wait_for(lambda: first(run_dir, "crash"), 60, what="the hang's kill")
        dumped = first(run_dir, "hang_dump")
        sigterm = first(run_dir, "signal", signal="SIGTERM")
        assert dumped is not None and sigterm is not None
        assert "py-spy not found" in dumped["error"] and dumped["top_frames"] == []
        # The kernel's side is still there.
        assert "wchan" in Path(dumped["path"]).read_text()
        assert dumped["t"] <= sigterm["t"] <= crash["t"]
        last_step_t = float((run_dir / "last_step_t").read_text())
        assert sigterm["t"] - last_step_t <= stall_s + dump_s + 2.0


def dump_cli(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "dump", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )


def test_dump_command_prints_the_frames_of_a_running_trainer_and_leaves_it_running(
    tmp_path: Path,
):
    run_dir = stuck_run(tmp_path / "run", stall_timeout_s=600.0)
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (run_dir / "stuck").exists(), 60, what="the trainer stuck")
        pid = daemon.status()["trainer_pid"]
        out = dump_cli(run_dir)
        assert out.returncode == 0, out.stderr
        assert "stuck_in_data_loader (stuck.py:" in out.stdout
        dumped = first(run_dir, "hang_dump", reason="request")
        assert dumped is not None and dumped["path"] in out.stdout
        assert "stuck_in_data_loader" in Path(dumped["path"]).read_text()
        assert pid_alive(pid) and first(run_dir, "signal") is None


def test_dump_command_without_a_daemon_is_one_line_and_exit_1(tmp_path: Path):
    run_dir = stuck_run(tmp_path / "run")
    out = dump_cli(run_dir)
    assert out.returncode == 1
    assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""


def test_a_py_spy_that_hangs_does_not_delay_the_kill_past_the_dump_timeout(tmp_path: Path):
    stall_s, dump_s = 3.0, 3.0
    hanging = tmp_path / "py-spy"
    hanging.write_text("#!/bin/sh\nexec sleep 600\n")
    hanging.chmod(0o755)
    run_dir = stuck_run(
        tmp_path / "run", stall_timeout_s=stall_s, dump_timeout_s=dump_s, py_spy=str(hanging)
    )
    with running_daemon(run_dir):
        crash = wait_for(lambda: first(run_dir, "crash"), 60, what="the hang's kill")
        dumped = first(run_dir, "hang_dump")
        sigterm = first(run_dir, "signal", signal="SIGTERM")
        assert dumped is not None and sigterm is not None
        assert dumped["error"] == "py-spy did not finish in time"
        assert sigterm["t"] <= crash["t"]
        last_step_t = float((run_dir / "last_step_t").read_text())
        assert sigterm["t"] - last_step_t <= stall_s + dump_s + 2.0


def test_a_torchrun_dump_holds_every_worker(tmp_path: Path):
    pytest.importorskip("torch.distributed")
    from tests.supervisor.test_torchrun import kill_workers, torchrun_run, worker_pids

    run_dir = torchrun_run(tmp_path / "run", "children")
    try:
        with running_daemon(run_dir) as daemon:
            workers = wait_for(lambda: len(pids := worker_pids(run_dir)) == 2 and pids, 120)
            agent = daemon.status()["trainer_pid"]
            dumped = daemon.request("dump", timeout=60)
            assert dumped["pids"][0] == agent and set(workers) <= set(dumped["pids"])
            assert dumped["error"] is None
            text = Path(dumped["path"]).read_text()
            for pid in (agent, *workers):
                assert f"=== pid {pid}:" in text and f"Thread {pid} " in text
            # The frames summarised are a worker's: its training loop, not the agent's wait.
            assert any("torchrun_worker.py" in frame for frame in dumped["top_frames"])
    finally:
        kill_workers(run_dir)


def test_dump_command_with_no_trainer_running_is_refused_in_one_line(tmp_path: Path):
    run_dir = make_run(tmp_path / "run", [PYTHON, "-c", "print('step: 1, loss: 1.0, dt: 0.1')"])
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=60)
        out = dump_cli(run_dir)
        assert out.returncode == 1 and out.stdout == ""
        assert out.stderr.strip() == (
            "trainwarden: refused (wrong_state): no trainer is running: there are no stacks to dump"
        )
        assert first(run_dir, "hang_dump") is None


def test_a_py_spy_that_overruns_is_ended_with_what_it_started(tmp_path: Path):
    fake = tmp_path / "py-spy"
    child = tmp_path / "child.pid"
    fake.write_text(f"#!/bin/sh\nsleep 900 &\necho $! > {child}\nsleep 900\n")
    fake.chmod(0o755)
    dump = capture([os.getpid()], str(fake), 1.0, "no py-spy")
    assert dump.processes[0].error == "py-spy did not finish in time"
    left = int(child.read_text())
    wait_for(lambda: not pid_alive(left), 10, what="the py-spy's own child ended")


def test_the_dumps_kept_are_the_newest_twenty_within_32_mib(tmp_path: Path):
    files = RunFiles(tmp_path)
    files.state_dir.mkdir()
    written = []
    for n in range(25):
        path = dump_path(files, 1_000_000.0 + n, n)
        write_dump(path, f"dump {n}\n")
        written.append(path.name)
    left = sorted(p.name for p in hangs_dir(files).iterdir())
    assert left == sorted(written[-20:])
    # Large ones (cut at 4 MiB each): the newest stay, as many as fit in 32 MiB together.
    big = "x" * (5 * 1024 * 1024)
    newest = []
    for n in range(25, 35):
        newest.append(dump_path(files, 1_000_000.0 + n, n))
        write_dump(newest[-1], big)
    left = sorted(p.name for p in hangs_dir(files).iterdir())
    assert left == sorted(p.name for p in newest[-8:])
    assert sum(p.stat().st_size for p in hangs_dir(files).iterdir()) <= 32 * 1024 * 1024


def test_a_denied_attach_is_said_as_the_cause_not_as_py_spys_sudo_advice(tmp_path: Path):
    fake = tmp_path / "py-spy"
    fake.write_text(
        "#!/bin/sh\necho 'Error: Permission Denied: Try running again with elevated permissions"
        ' by going \'"\'"\'sudo env "PATH=$PATH" !!\'"\'"\nexit 1\n'
    )
    fake.chmod(0o755)
    (process,) = capture([os.getpid()], str(fake), 10.0, "no py-spy").processes
    assert process.error is not None and "sudo" not in process.error
    assert "permission denied" in process.error and "ptrace" in process.error


def stacks(pid: int, *frames: str) -> ProcessStacks:
    """A process whose main thread py-spy found in `frames` (innermost first)."""
    text = f'Thread {pid} (idle): "MainThread"\n' + "".join(f"    {f}\n" for f in frames)
    return ProcessStacks(pid, text, None, "")


def test_the_top_frames_are_the_main_process_not_an_idle_data_loader_child():
    main = stacks(100, "hang_here (train.py:12)", "<module> (train.py:40)")
    children = [stacks(200 + n, "<module> (worker.py:3)") for n in range(3)]
    assert StackDump((main, *children)).top_frames[0] == "hang_here (train.py:12)"
    # A launcher only waits on its workers: the first worker's frames are the trainer's.
    agent = stacks(100, "_monitor (torch/distributed/elastic/agent/server/api.py:9)")
    worker = stacks(200, "allreduce (train.py:55)")
    assert StackDump((agent, worker)).top_frames == ["allreduce (train.py:55)"]
    # The main process unreadable: the first that is.
    unreadable = ProcessStacks(100, "", "py-spy did not finish in time", "")
    assert StackDump((unreadable, worker)).top_frames == ["allreduce (train.py:55)"]
