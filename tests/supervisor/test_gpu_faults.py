"""GPU faults by class: the pure classifier and policy, then a real daemon whose NVML is the
stub of tests/supervisor/fake_pynvml.py (XIDs pushed through its control folder)."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from tests.supervisor.fake_pynvml import FakeNvml
from tests.support import journal, running_daemon, scripted_run, wait_for
from tests.support.policy import decide_all, of
from trainwarden.supervisor.cli.output import describe_result
from trainwarden.supervisor.core import policy as p
from trainwarden.supervisor.inputs.gpu import Nvml
from trainwarden.supervisor.inputs.gpu_events import GpuEventWatcher

REPO = Path(__file__).resolve().parent.parent.parent
RULES = p.Rules(backoff_initial_s=1.0, stop_timeout_s=10.0, max_restarts_without_progress=3)


def run(events: list[object], state: p.State | None = None, rules: p.Rules = RULES):
    return decide_all(events, state, rules)


def records(actions: list[object], kind: str) -> list[dict]:
    return [a.fields for a in actions if isinstance(a, p.Record) and a.kind == kind]


def running(pid: int = 100) -> p.State:
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, pid), p.StepLogged(1.0, 1, 3.0)])
    assert state.phase == "running"
    return state


# ------------------------------------------------------------------ the classifier


@pytest.mark.parametrize(
    ("xid", "cls"),
    [
        (13, "application"),
        (31, "application"),
        (43, "application"),
        (94, "application"),
        (46, "reset"),
        (62, "reset"),
        (74, "reset"),
        (95, "reset"),
        (119, "reset"),
        (79, "reboot"),
        (48, "memory"),
        (63, "memory"),
        (64, "memory"),
        (999, "unknown"),
    ],
)
def test_xids_are_classed_as_the_catalogue_does(xid: int, cls: str):
    assert p.classify(xid) == cls


def test_the_drivers_recovery_action_can_only_make_the_class_more_severe():
    assert p.classify(13, "gpu_reset") == "reset"
    assert p.classify(13, "node_reboot") == "reboot"
    assert p.classify(79, "none") == "reboot"
    assert p.classify(46, "none") == "reset"


# ------------------------------------------------------------------ the policy


def test_application_xid_takes_the_crash_path_and_the_crash_names_it():
    state, actions = run([p.GpuFault(2.0, 0, 13)], running())
    (fault,) = records(actions, "gpu_fault")
    assert fault["class"] == "application" and fault["action"] == "crash_path"
    assert not of(actions, p.SignalTrainer) and state.phase == "running"
    state, actions = run([p.TrainerExited(3.0, 100, 1), p.Tick(10.0)], state)
    (crash,) = records(actions, "crash")
    assert crash["xid"] == 13
    assert of(actions, p.Spawn) and state.phase == "starting"


def test_xid_79_stops_the_trainer_and_halts_with_the_reboot_instruction():
    state, actions = run([p.GpuFault(2.0, 0, 79)], running())
    (sig,) = of(actions, p.SignalTrainer)
    assert sig.signal == "SIGTERM" and sig.reason == "gpu_fault"
    state, actions = run([p.TrainerExited(3.0, 100, -15), p.Tick(100.0)], state)
    assert state.phase == "gpu_fault" and "reboot" in (state.halt_reason or "")
    (halt,) = records(actions, "halt")
    assert halt["state"] == "gpu_fault" and halt["xid"] == 79
    assert not of(actions, p.Spawn) and not of(actions, p.AwaitGpuIdle)


def test_xid_79_during_a_backoff_cancels_the_restart():
    state, _ = run([p.TrainerExited(2.0, 100, 1)], running())
    assert state.phase == "backoff"
    state, actions = run([p.GpuFault(2.1, 0, 79), p.Tick(100.0)], state)
    assert state.phase == "gpu_fault" and not of(actions, p.Spawn)


def test_reset_class_waits_for_the_gpu_to_be_free_then_halts_with_the_reset_instruction():
    state, actions = run([p.GpuFault(2.0, 0, 46)], running())
    assert of(actions, p.SignalTrainer)
    state, actions = run([p.TrainerExited(3.0, 100, -15)], state)
    (wait,) = of(actions, p.AwaitGpuIdle)
    assert wait.gpu == 0 and state.phase == "stopping"
    state, actions = run([p.Tick(100.0)], state)
    assert not of(actions, p.Spawn)
    state, actions = run([p.GpuIdle(5.0, 0, (4242,), 60.0)], state)
    assert records(actions, "gpu_busy")[0]["pids"] == [4242]
    assert state.phase == "gpu_fault" and "nvidia-smi -r -i 0" in (state.halt_reason or "")
    assert not of(actions, p.ResetGpu)


RESETTING = [p.GpuFault(2.0, 0, 119), p.TrainerExited(3.0, 100, -15), p.GpuIdle(4.0, 0)]
"""A reset-class fault, its trainer gone, the GPU free: with [gpu] reset on, the daemon resets
it (a ResetGpu under way)."""


def test_with_reset_allowed_the_gpu_is_reset_and_the_run_resumes():
    rules = replace(RULES, gpu_reset=True)
    state, actions = run(
        [p.GpuFault(2.0, 0, 119), p.TrainerExited(3.0, 100, -15)], running(), rules
    )
    state, actions = run([p.GpuIdle(4.0, 0)], state, rules)
    assert of(actions, p.ResetGpu) == [p.ResetGpu(0)]
    state, actions = run([p.GpuResetDone(9.0, 0, True)], state, rules)
    assert of(actions, p.Spawn) and state.phase == "starting" and state.gpu_fault is None


def replies(actions: list[object]) -> list[p.Reply]:
    return of(actions, p.Reply)


def test_a_stop_while_the_trainer_is_stopped_for_a_fault_stands_with_no_reset_or_restart():
    rules = replace(RULES, gpu_reset=True)
    state, actions = run([p.GpuFault(2.0, 0, 119)], running(), rules)
    assert of(actions, p.SignalTrainer)
    state, actions = run([p.Operator(2.5, 7, p.Stop(), None)], state, rules)
    assert not replies(actions)  # answered at the exit, as any stop is
    (said,) = of(actions, p.Progress)
    assert "GPU 0" in said.message and "no restart" in said.message
    state, actions = run([p.TrainerExited(3.0, 100, -15, "SIGTERM")], state, rules)
    assert not of(actions, p.AwaitGpuIdle) and not of(actions, p.ResetGpu)
    assert not of(actions, p.Spawn) and state.phase == "gpu_fault"
    assert "nvidia-smi -r -i 0" in (state.halt_reason or "")  # what the GPU still needs
    (reply,) = replies(actions)
    assert reply.ok and reply.request_id == 7 and reply.result["state"] == "gpu_fault"
    assert reply.result["exit"] == "killed by SIGTERM"
    # What `trainwarden stop` prints: how the trainer ended, and that the run halted.
    printed = describe_result("stop", reply.result)
    assert printed.startswith("trainer stopped: exited without saving (steps lost: 1): killed by")
    assert printed.endswith("; the run halted (gpu_fault): `trainwarden status` says why")
    state, actions = run([p.Tick(100.0), p.GpuIdle(101.0, 0)], state, rules)
    assert not of(actions, p.Spawn) and not of(actions, p.ResetGpu)


def test_a_stop_during_a_fault_names_the_save_the_trainer_made_on_its_way_out():
    state, _ = run([p.GpuFault(2.0, 0, 79), p.Operator(2.5, 7, p.Stop(), None)], running())
    state, actions = run(
        [p.CheckpointSeen(2.8, "step_000001.bin", 1), p.TrainerExited(3.0, 100, 0)], state
    )
    assert state.phase == "gpu_fault" and not replies(actions)  # its save is being verified
    state, actions = run([p.CheckpointCommitted(3.2, 1, "step_000001.bin", 100)], state)
    (reply,) = replies(actions)
    assert reply.ok and reply.result["state"] == "gpu_fault"
    assert reply.result["outcome"] == "saved" and reply.result["checkpoint"]["step"] == 1


def test_a_stop_while_the_daemon_waits_for_the_faulted_gpu_halts_at_once():
    rules = replace(RULES, gpu_reset=True)
    state, _ = run([p.GpuFault(2.0, 0, 119), p.TrainerExited(3.0, 100, -15)], running(), rules)
    assert state.phase == "stopping" and not state.trainer_alive
    state, actions = run([p.Operator(3.5, 7, p.Stop(), None)], state, rules)
    (reply,) = replies(actions)
    assert reply.ok and reply.result["state"] == "gpu_fault"
    assert state.phase == "gpu_fault"
    state, actions = run([p.GpuIdle(4.0, 0), p.Tick(100.0)], state, rules)
    assert not of(actions, p.ResetGpu) and not of(actions, p.Spawn)


def test_a_reset_under_way_when_a_stop_halts_the_run_is_still_journaled():
    rules = replace(RULES, gpu_reset=True)
    state, _ = run(RESETTING, running(), rules)
    state, _ = run([p.Operator(4.5, 7, p.Stop(), None)], state, rules)
    state, actions = run([p.GpuResetDone(9.0, 0, True)], state, rules)
    assert records(actions, "gpu_reset") == [{"gpu": 0, "ok": True, "error": None}]
    assert not of(actions, p.Spawn) and state.phase == "gpu_fault"


def test_a_failed_reset_halts_and_says_why():
    rules = replace(RULES, gpu_reset=True)
    state, _ = run(RESETTING, running(), rules)
    state, actions = run(
        [p.GpuResetDone(9.0, 0, False, "nvidia-smi is not installed")], state, rules
    )
    assert state.phase == "gpu_fault" and "nvidia-smi is not installed" in (state.halt_reason or "")
    assert not of(actions, p.Spawn)


def test_a_memory_xid_allows_one_restart_and_the_second_halts():
    state, actions = run([p.GpuFault(2.0, 0, 64)], running())
    assert records(actions, "gpu_fault")[0]["action"] == "restart_allowed_once"
    assert not of(actions, p.SignalTrainer)
    state, actions = run([p.TrainerExited(3.0, 100, 1), p.Tick(10.0)], state)
    assert of(actions, p.Spawn)
    state, _ = run([p.TrainerSpawned(10.0, 101), p.StepLogged(11.0, 2, 3.0)], state)
    state, actions = run([p.GpuFault(12.0, 0, 48)], state)
    assert records(actions, "gpu_fault")[0]["action"] == "halt" and of(actions, p.SignalTrainer)
    state, _ = run([p.TrainerExited(13.0, 101, -15), p.GpuIdle(14.0, 0)], state)
    assert state.phase == "gpu_fault"


def test_the_memory_fault_count_survives_a_daemon_restart():
    state, _ = run([p.GpuFault(2.0, 0, 63)], running())
    restored = p.restore(p.persisted(state), RULES)
    assert restored.memory_faults == 1


def test_a_lost_gpu_halts_without_waiting_for_it():
    state, actions = run([p.GpuLost(2.0, 0, "NVMLError_GpuIsLost: GPU is lost")], running())
    assert records(actions, "gpu_fault")[0]["class"] == "lost"
    state, actions = run([p.TrainerExited(3.0, 100, -9)], state)
    assert state.phase == "gpu_fault" and not of(actions, p.AwaitGpuIdle)
    assert "stopped answering NVML" in (state.halt_reason or "")


def test_start_after_a_gpu_fault_halt_starts_the_trainer():
    state, _ = run([p.GpuFault(2.0, 0, 79), p.TrainerExited(3.0, 100, -15)], running())
    state, actions = run([p.Operator(5.0, 1, p.Start())], state)
    assert of(actions, p.Spawn) and state.phase == "starting"


def test_faults_on_a_gpu_the_run_does_not_use_are_only_journaled():
    rules = replace(RULES, gpu_devices=(0, 1))
    state, actions = run([p.GpuFault(2.0, 3, 79), p.GpuLost(2.5, 2, "GpuIsLost")], running(), rules)
    assert [r["action"] for r in records(actions, "gpu_fault")] == [
        "none: not a GPU of this run"
    ] * 2
    assert not of(actions, p.SignalTrainer) and state.phase == "running"
    state, actions = run([p.GpuFault(3.0, 1, 79)], state, rules)
    assert of(actions, p.SignalTrainer)


def test_a_fault_while_halted_is_only_journaled():
    state, _ = run([p.GpuFault(2.0, 0, 79), p.TrainerExited(3.0, 100, -15)], running())
    state, actions = run([p.GpuFault(4.0, 0, 46)], state)
    assert records(actions, "gpu_fault")[0]["action"].startswith("none")
    assert not of(actions, p.SignalTrainer) and not of(actions, p.AwaitGpuIdle)


# ------------------------------------------------------------------ throttling


def test_throttling_is_journaled_once_per_episode_after_the_window_with_the_mfu_drop():
    watch = p.Throttle()
    out = []
    t = 0.0
    for _ in range(5):  # unthrottled: the MFU before
        watch, rec = p.throttle_step(watch, t, (), 0.40, 60.0)
        out.append(rec)
        t += 2.0
    start = t
    while t - start <= 130.0:
        watch, rec = p.throttle_step(watch, t, ("hw_thermal",), 0.25, 60.0)
        out.append((t - start, rec))
        t += 2.0
    reported = [(dt, rec) for dt, rec in (x for x in out if isinstance(x, tuple)) if rec]
    assert len(reported) == 1
    dt, rec = reported[0]
    assert 60.0 <= dt < 62.0
    assert rec["reasons"] == ["hw_thermal"] and rec["mfu_drop"] == pytest.approx(0.15)
    watch, rec = p.throttle_step(watch, t, (), 0.40, 60.0)
    assert rec is None
    for i in range(32):
        watch, rec = p.throttle_step(watch, t + 2 * i, ("hw_power_brake",), 0.3, 60.0)
        if rec:
            break
    assert rec is not None and rec["reasons"] == ["hw_power_brake"]


def test_a_short_throttle_is_not_journaled():
    watch = p.Throttle()
    for i in range(29):
        watch, rec = p.throttle_step(watch, 2.0 * i, ("sw_thermal",), 0.3, 60.0)
        assert rec is None
    watch, rec = p.throttle_step(watch, 60.0, (), 0.3, 60.0)
    assert rec is None


# ------------------------------------------------------------------ the NVML event watcher


def watch(fake: FakeNvml) -> tuple[GpuEventWatcher, list[tuple]]:
    seen: list[tuple] = []
    nvml = Nvml()
    nvml._module, nvml._tried = fake.module, True  # the stub, already initialised
    watcher = GpuEventWatcher(
        nvml,
        lambda gpu, xid, rec: seen.append(("xid", gpu, xid, rec)),
        lambda gpu, err: seen.append(("lost", gpu, err)),
        wait_ms=100,
    )
    watcher.start()
    assert watcher.ready.wait(10)
    return watcher, seen


def test_watcher_reports_each_xid_with_its_gpu_and_recovery_action():
    fake = FakeNvml(device_count=2)
    watcher, seen = watch(fake)
    try:
        assert watcher.watching == [0, 1]
        fake.push_xid(79, gpu=1, recovery=2)
        fake.push_xid(13, gpu=0)
        wait_for(lambda: len(seen) == 2, 10, what="two XIDs")
        assert seen == [("xid", 1, 79, "node_reboot"), ("xid", 0, 13, None)]
    finally:
        watcher.stop()


def test_watcher_reports_a_gpu_that_stops_answering_once():
    fake = FakeNvml()
    watcher, seen = watch(fake)
    try:
        fake.lose()
        wait_for(lambda: seen, 10, what="the lost GPU")
        assert seen[0][:2] == ("lost", 0) and "GpuIsLost" in seen[0][2]
        waits = fake.calls["nvmlEventSetWait_v2"]
        wait_for(lambda: fake.calls["nvmlEventSetWait_v2"] > waits + 3, 10, what="more waits")
        assert len(seen) == 1
    finally:
        watcher.stop()


def test_watcher_without_xid_events_still_notices_a_lost_gpu():
    fake = FakeNvml()
    fake.supported_events = 0
    watcher, seen = watch(fake)
    try:
        assert watcher.watching == [] and 0 in watcher.without_events
        fake.lose()
        wait_for(lambda: seen, 10, what="the lost GPU")
        assert seen[0][:2] == ("lost", 0)
    finally:
        watcher.stop()


# ------------------------------------------------------------------ a real daemon


def stub_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """PYTHONPATH with a `pynvml` that is the stub, driven through the returned folder."""
    shim, control = tmp_path / "shim", tmp_path / "nvml-control"
    shim.mkdir()
    control.mkdir()
    (shim / "pynvml.py").write_text(
        "import sys\n"
        "from pathlib import Path\n"
        "from tests.supervisor.fake_pynvml import FakeNvml\n"
        f"fake = FakeNvml(control_dir=Path({str(control)!r}))\n"
        "sys.modules[__name__] = fake.module\n"
    )
    return {"PYTHONPATH": f"{shim}{os.pathsep}{REPO}"}, control


def push_xid(control: Path, xid: int, gpu: int = 0) -> None:
    with (control / "xids").open("a") as f:
        f.write(f"{gpu} {xid}\n")


def kinds_of(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in journal(run_dir) if r.get("kind") == kind]


def starts(run_dir: Path) -> int:
    return len(kinds_of(run_dir, "trainer_started"))


def long_run(tmp_path: Path) -> Path:
    return scripted_run(tmp_path / "run", "--steps", "100000", "--save-every", "50", "--dt", "0.02")


@pytest.mark.timeout(240)
def test_daemon_xid_13_leads_to_a_normal_restart(tmp_path: Path):
    env, control = stub_env(tmp_path)
    run_dir = long_run(tmp_path)
    with running_daemon(run_dir, env=env) as daemon:
        pid = daemon.wait_state("running")["trainer_pid"]
        push_xid(control, 13)
        wait_for(lambda: kinds_of(run_dir, "gpu_fault"), 30, what="the gpu_fault record")
        (fault,) = kinds_of(run_dir, "gpu_fault")
        assert fault["xid"] == 13 and fault["class"] == "application"
        os.kill(pid, signal.SIGKILL)  # what the XID does to a real trainer
        wait_for(lambda: starts(run_dir) == 2, 60, what="the restart")
        assert daemon.wait_state("running")["trainer_pid"] != pid
        (crash,) = kinds_of(run_dir, "crash")
        assert crash["xid"] == 13


@pytest.mark.timeout(240)
def test_daemon_xid_79_halts_in_gpu_fault_without_a_restart(tmp_path: Path):
    env, control = stub_env(tmp_path)
    run_dir = long_run(tmp_path)
    with running_daemon(run_dir, env=env) as daemon:
        daemon.wait_state("running")
        (watching,) = wait_for(lambda: kinds_of(run_dir, "gpu_events"), 30, what="gpu_events")
        assert watching["watching"] == [0] and watching["without_events"] == {}
        push_xid(control, 79)
        status = daemon.wait_state("gpu_fault", timeout=60)
        assert "reboot" in status["detail"]["reason"]
        (fault,) = kinds_of(run_dir, "gpu_fault")
        assert fault["class"] == "reboot" and fault["action"] == "halt"
        (halt,) = kinds_of(run_dir, "halt")
        assert halt["state"] == "gpu_fault" and halt["xid"] == 79
        assert starts(run_dir) == 1 and status["trainer_pid"] is None
        # After the reboot the operator starts it again.
        daemon.request("start")
        daemon.wait_state("running")
        assert starts(run_dir) == 2


@pytest.mark.timeout(240)
def test_daemon_xid_64_is_journaled_and_allows_one_restart(tmp_path: Path):
    env, control = stub_env(tmp_path)
    run_dir = long_run(tmp_path)
    with running_daemon(run_dir, env=env) as daemon:
        pid = daemon.wait_state("running")["trainer_pid"]
        push_xid(control, 64)
        wait_for(lambda: kinds_of(run_dir, "gpu_fault"), 30, what="the gpu_fault record")
        assert kinds_of(run_dir, "gpu_fault")[0]["action"] == "restart_allowed_once"
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: starts(run_dir) == 2, 60, what="the one restart")
        daemon.wait_state("running")
        push_xid(control, 64)
        status = daemon.wait_state("gpu_fault", timeout=60)
        assert "nvidia-smi -r" in status["detail"]["reason"]
        assert starts(run_dir) == 2


@pytest.mark.timeout(240)
def test_daemon_gpu_that_stops_answering_nvml_halts_in_gpu_fault(tmp_path: Path):
    env, control = stub_env(tmp_path)
    run_dir = long_run(tmp_path)
    with running_daemon(run_dir, env=env) as daemon:
        daemon.wait_state("running")
        wait_for(lambda: daemon.status()["gpu"], 30, what="a GPU sample (NVML worked)")
        (control / "lost").touch()
        status = daemon.wait_state("gpu_fault", timeout=60)
        assert "stopped answering NVML" in status["detail"]["reason"]
        (fault,) = kinds_of(run_dir, "gpu_fault")
        assert fault["class"] == "lost" and "GpuIsLost" in fault["message"]
        assert starts(run_dir) == 1


@pytest.mark.timeout(240)
def test_daemon_journals_a_thermal_throttle_longer_than_the_window_once(tmp_path: Path):
    env, control = stub_env(tmp_path)
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps",
        "100000",
        "--save-every",
        "50",
        "--dt",
        "0.02",
        telemetry={"n_params": 124_356_864, "sample_interval_s": 0.1},
        gpu={"throttle_after_s": 1.0},
    )
    with running_daemon(run_dir, env=env) as daemon:
        wait_for(lambda: daemon.status()["mfu"] is not None, 30, what="an MFU")
        wait_for(lambda: daemon.status()["gpu"], 30, what="a GPU sample")
        # Several samples (0.1 s apart) that saw the MFU before the throttle begins.
        step = daemon.status()["step"]
        wait_for(lambda: daemon.status()["step"] >= step + 50, 60, what="50 more steps")
        (control / "reasons").write_text("0x44")  # power cap (normal) and hardware thermal
        (record,) = wait_for(lambda: kinds_of(run_dir, "gpu_throttle"), 30, what="gpu_throttle")
        assert record["gpu"] == 0 and record["reasons"] == ["hw_thermal"]
        assert record["seconds"] >= 1.0 and record["mfu_before"] is not None
        assert "mfu_drop" in record
        # Still throttled for another second or more (many samples at 0.1 s): no second record.
        step = daemon.status()["step"]
        wait_for(lambda: daemon.status()["step"] >= step + 100, 60, what="100 more steps")
        assert len(kinds_of(run_dir, "gpu_throttle")) == 1


def test_a_daemon_restarted_while_a_fault_is_handled_halts_instead_of_restarting():
    state, actions = run([p.GpuFault(2.0, 0, 46), p.TrainerExited(3.0, 100, -15)], running())
    assert of(actions, p.AwaitGpuIdle) and state.phase == "stopping"
    restored, actions = run([p.Restored(0.0, p.persisted(state)), p.Startup(0.0)])
    assert restored.phase == "gpu_fault" and not of(actions, p.Spawn)
    assert "nvidia-smi -r -i 0" in (restored.halt_reason or "")


def test_a_worse_fault_while_one_is_handled_changes_the_instruction():
    state, _ = run([p.GpuFault(2.0, 0, 46), p.TrainerExited(3.0, 100, -15)], running())
    state, actions = run([p.GpuFault(3.5, 0, 79)], state)
    assert records(actions, "gpu_fault")[0]["action"] == "halt"
    state, _ = run([p.GpuIdle(4.0, 0)], state)
    assert state.phase == "gpu_fault" and "reboot" in (state.halt_reason or "")
    state, _ = run([p.GpuFault(2.0, 0, 46), p.TrainerExited(3.0, 100, -15)], running())
    state, actions = run([p.GpuFault(3.5, 0, 13)], state)
    assert records(actions, "gpu_fault")[0]["action"] == "none: already handling a GPU fault"


def test_a_daemon_shut_down_while_it_stops_a_trainer_for_a_fault_halts_when_it_starts_again():
    """systemctl stop (SIGTERM) during the fault's kill: the next daemon halts in gpu_fault
    with the instruction, as it does after a daemon killed at that moment."""
    state, _ = run([p.GpuFault(2.0, 0, 46)], running())
    state, actions = run(
        [p.ShutdownRequested(2.5, "SIGTERM"), p.TrainerExited(3.0, 100, -15)], state
    )
    assert of(actions, p.Exit) and not of(actions, p.AwaitGpuIdle)
    restored = p.restore(p.persisted(state), RULES)
    state, actions = run([p.Startup(10.0)], restored)
    assert state.phase == "gpu_fault" and "nvidia-smi -r -i 0" in (state.halt_reason or "")
    assert not of(actions, p.Spawn) and not records(actions, "resumed_after_signal")
    assert records(actions, "idle")[0]["state"] == "gpu_fault"


def test_a_fault_during_an_operators_stop_halts_in_gpu_fault_with_the_instruction():
    state, _ = run([p.Operator(2.0, 7, p.Stop(), None)], running())
    state, actions = run([p.GpuFault(2.5, 0, 46), p.TrainerExited(3.0, 100, -15)], state)
    assert state.phase == "gpu_fault" and "nvidia-smi -r -i 0" in (state.halt_reason or "")
    (reply,) = replies(actions)
    assert reply.ok and reply.result["state"] == "gpu_fault"
    assert not of(actions, p.Spawn) and not of(actions, p.AwaitGpuIdle)
