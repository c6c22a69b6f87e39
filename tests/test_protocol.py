"""The protocol's types against itself and against what a live daemon really sends."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, get_args

import pytest

from tests.support import (
    PYTHON,
    belongs_to_run,
    kill_quietly,
    make_run,
    poll,
    running_daemon,
    wait_for,
)
from trainwarden.supervisor import client as client_module
from trainwarden.supervisor import protocol, wire
from trainwarden.supervisor.core import phases
from trainwarden.supervisor.protocol import (
    RESULTS,
    TOPIC_DATA,
    TOPICS,
    AuditResult,
    Checkpoint,
    CheckpointRef,
    CheckpointsView,
    EventsResult,
    GpuSample,
    HelloResult,
    HistoryResult,
    HostSample,
    JournalRecord,
    LogStats,
    Marker,
    PinResult,
    Push,
    Quarantined,
    SaveRequested,
    Snapshot,
    StartResult,
    StateDetail,
    StateView,
    StatusResult,
    StopResult,
    SubscribeResult,
    Telemetry,
    UnpinPreview,
)

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parent.parent
SCRIPTED = str(REPO / "tests" / "scripted_trainer.py")


def assert_shape(value: Any, shape: Any, where: str) -> None:
    """`value` has every key `shape` requires and none it does not name."""
    assert isinstance(value, dict), f"{where}: expected an object, got {value!r}"
    keys = set(value)
    missing = shape.__required_keys__ - keys
    extra = keys - set(shape.__annotations__)
    assert not missing and not extra, f"{where}: missing {sorted(missing)}, extra {sorted(extra)}"


# ----------------------------------------------------------------------------- the names


def test_topics_commands_and_codes_are_one_list_each():
    assert get_args(protocol.Topic) == TOPICS
    assert len(set(TOPICS)) == len(TOPICS)
    # Every topic but the journal stream carries its whole current value.
    assert set(TOPICS) - protocol.REPLACEABLE_TOPICS == {"events"}
    assert "checkpoints" in protocol.REPLACEABLE_TOPICS
    assert set(TOPIC_DATA) == set(TOPICS) == set(Snapshot.__annotations__)
    assert set(RESULTS) | {"subscribe"} == set(protocol.COMMANDS)
    assert not set(protocol.READ_COMMANDS) & set(protocol.ACTING_COMMANDS)
    assert len(set(protocol.ERROR_CODES)) == len(protocol.ERROR_CODES)
    assert tuple(StateView.__annotations__) == protocol.STATE_KEYS
    assert set(protocol.TELEMETRY_KEYS) <= set(StatusResult.__annotations__)


def test_protocol_reexports_the_framing_the_clients_and_the_phases():
    assert protocol.encode is wire.encode and protocol.decode is wire.decode
    assert protocol.MAX_LINE == wire.MAX_LINE and protocol.connect_path is wire.connect_path
    assert protocol.Client is client_module.Client
    assert protocol.AsyncClient is client_module.AsyncClient
    assert protocol.unreachable is client_module.unreachable
    assert protocol.not_running_message is client_module.not_running_message
    assert protocol.Phase is phases.Phase and protocol.HALTED is phases.HALTED
    assert protocol.PROTOCOL_VERSION == 1


# ----------------------------------------------------------------------------- a live daemon


def scripted_run(run_dir: Path) -> Path:
    return make_run(
        run_dir,
        [PYTHON, SCRIPTED, "--steps", "1000000", "--save-every", "20", "--usr1", "save"],
        trainer={"stop_timeout_s": 10.0, "total_steps": 1_000_000},
        restart={"backoff_initial_s": 0.0, "backoff_max_s": 0.5},
        telemetry={"tokens_per_step": 512, "n_params": "auto", "vocab_size": 256},
    )


def fake_gpu(tmp_path: Path) -> dict[str, str]:
    """An environment whose pynvml is the fake one: a GPU sample to hold to its type."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pynvml.py").write_text(
        "import sys\n"
        "from tests.supervisor.fake_pynvml import FakeNvml\n"
        "sys.modules[__name__] = FakeNvml().module\n"
    )
    return {"PYTHONPATH": f"{shim}{os.pathsep}{REPO}"}


def check_status(status: dict[str, Any]) -> None:
    assert_shape(status, StatusResult, "status")
    assert status["state"] in set(protocol.Phase)
    assert_shape(status["detail"], StateDetail, "status.detail")
    for ckpt in status["checkpoints"]:
        assert_shape(ckpt, Checkpoint, "status.checkpoints[]")
    for bad in status["quarantined"]:
        assert_shape(bad, Quarantined, "status.quarantined[]")
    assert_shape(status["gpu"], GpuSample, "status.gpu")
    assert_shape(status["host"], HostSample, "status.host")
    assert_shape(status["log"], LogStats, "status.log")
    if status["resume_audit"] is not None:
        assert_shape(status["resume_audit"], AuditResult, "status.resume_audit")


def check_push(message: dict[str, Any]) -> None:
    assert_shape(message, Push, "push")
    topic, data = message["topic"], message["data"]
    assert topic in TOPICS
    shape = {
        "telemetry": Telemetry,
        "gpu": GpuSample,
        "host": HostSample,
        "checkpoints": CheckpointsView,
        "events": JournalRecord,
        "state": StateView,
    }.get(topic)
    if shape is JournalRecord:
        assert JournalRecord.__required_keys__ <= set(data), data
    elif shape is not None:
        assert_shape(data, shape, f"push {topic}")


def read_pushes(client: Any, until: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Pushes as they come, each held to its topic's type, until `until(pushes)`."""
    pushes: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not until(pushes):
        assert time.monotonic() < deadline, f"pushes so far: {[p['topic'] for p in pushes]}"
        message = client.read_message()
        check_push(message)
        pushes.append(message)
    return pushes


def test_the_types_match_what_a_live_daemon_sends(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run")
    # A file that fails verification: the quarantined list then has an entry to check.
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "step_000003.bin").write_bytes(b"not a checkpoint")
    with running_daemon(run_dir, env=fake_gpu(tmp_path)) as daemon:
        assert_shape(daemon.request("hello"), HelloResult, "hello")
        status = wait_for(
            lambda: (
                (s := daemon.status())["checkpoints"]
                and s["quarantined"]
                and s["gpu"]
                and s["host"]
                and s
            ),
            60,
            what="a checkpoint, a quarantined file, GPU and host samples",
        )
        check_status(status)

        with daemon.client(timeout=30.0) as watcher:
            subscribed = watcher.request("subscribe", topics=list(TOPICS))
            assert_shape(subscribed, SubscribeResult, "subscribe")
            snapshot = subscribed["snapshot"]
            assert set(snapshot) == set(TOPICS)
            assert_shape(snapshot["telemetry"], Telemetry, "snapshot.telemetry")
            assert_shape(snapshot["state"], StateView, "snapshot.state")
            assert_shape(snapshot["checkpoints"], CheckpointsView, "snapshot.checkpoints")
            assert_shape(snapshot["gpu"], GpuSample, "snapshot.gpu")
            assert_shape(snapshot["host"], HostSample, "snapshot.host")
            assert snapshot["events"] and all(
                JournalRecord.__required_keys__ <= set(r) for r in snapshot["events"]
            )
            read_pushes(
                watcher,
                lambda pushes: (
                    {"telemetry", "host", "gpu", "events"} <= {p["topic"] for p in pushes}
                ),
            )

            history = daemon.request("history", points=50)
            assert_shape(history, HistoryResult, "history")
            listed = daemon.request("checkpoints")
            assert_shape(listed, CheckpointsView, "checkpoints")
            step = listed["checkpoints"][-1]["step"]
            events = daemon.request("events", n=5)
            assert_shape(events, EventsResult, "events")
            assert len(events["events"]) == 5

            assert_shape(daemon.request("pin", step=step), PinResult, "pin")
            preview = daemon.request("unpin", step=step, dry_run=True)
            assert_shape(preview, UnpinPreview, "unpin dry run")
            assert_shape(daemon.request("unpin", step=step), PinResult, "unpin")

            assert_shape(daemon.request("save"), SaveRequested, "save")
            # A trainer killed from outside restarts from its newest checkpoint and replays
            # the steps logged since, so a resume audit follows. A kill that lands right
            # after a commit (the save's, or a periodic one) leaves nothing to replay: then
            # kill the next start again.
            status = None
            for _ in range(5):
                running = wait_for(
                    lambda: (
                        (s := daemon.status())["state"] == "running"
                        and (s["step"] or 0) >= (s["last_checkpoint_step"] or 0) + 2
                        and s
                    ),
                    60,
                    what="steps logged beyond the newest checkpoint",
                )
                pid = running["trainer_pid"]
                assert belongs_to_run(pid, daemon.run_dir)
                kill_quietly(pid)
                status = poll(
                    lambda seg=running["seg"]: (
                        (s := daemon.status())["resume_audit"]
                        and s["seg"] > seg
                        and s["state"] == "running"
                        and s
                    ),
                    15,
                )
                if status:
                    break
            assert status, "no restart replayed a step: " + str(daemon.status())
            check_status(status)
            history = daemon.request("history", points=50)
            assert history["markers"]
            for marker in history["markers"]:
                assert_shape(marker, Marker, "history.markers[]")

            stopped = daemon.request("stop")
            assert_shape(stopped, StopResult, "stop")
            assert stopped["state"] == "stopped"
            assert_shape(stopped["checkpoint"], CheckpointRef, "stop.checkpoint")
            read_pushes(watcher, lambda pushes: any(p["topic"] == "state" for p in pushes))
            check_status(daemon.status())

            started = daemon.request("start")
            assert_shape(started, StartResult, "start")
            assert "resume_step" in started
            daemon.wait_state("running", timeout=60)

            shut = daemon.request("shutdown")
            assert_shape(shut, StopResult, "shutdown")
            assert_shape(shut["checkpoint"], CheckpointRef, "shutdown.checkpoint")
        assert daemon.wait_exit(30) == 0
