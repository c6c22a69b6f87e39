"""A GPU that falls off the bus (Xid 79), reported by the stub `pynvml`, halts the run in
`gpu_fault` with no restart and reaches the owner as alerts on a loopback HTTP server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.supervisor.test_alerts import Inbox, assert_no_secret, inbox  # noqa: F401
from tests.supervisor.test_gpu_faults import kinds_of, push_xid, starts, stub_env
from tests.support import running_daemon, scripted_run, wait_for

pytestmark = pytest.mark.timeout(240)


def test_xid_79_halts_in_gpu_fault_and_alerts_the_owner(tmp_path: Path, inbox: Inbox):  # noqa: F811
    env, control = stub_env(tmp_path)
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps", "100000", "--save-every", "50", "--dt", "0.02",
        alerts={"urls": [inbox.url], "timeout_s": 5.0, "retries": 1},
    )  # fmt: skip
    with running_daemon(run_dir, env=env) as daemon:
        daemon.wait_state("running")
        wait_for(lambda: kinds_of(run_dir, "gpu_events"), 30, what="the NVML event watcher")
        push_xid(control, 79)
        daemon.wait_state("gpu_fault", timeout=60)
        wait_for(
            lambda: any("halted in gpu_fault" in t for t in inbox.titles()),
            60,
            what="the halt alert",
        )
        assert starts(run_dir) == 1  # no restart into a broken GPU
        gpu = [m for m in inbox.received if "GPU 0 fault" in m["title"]]
        halted = [m for m in inbox.received if "halted in gpu_fault" in m["title"]]
        assert len(gpu) == 1 and len(halted) == 1, inbox.titles()
        assert "79" in gpu[0]["message"] and "reboot" in halted[0]["message"].lower()
        assert f"trainwarden tui {run_dir}" in halted[0]["message"]
        # Journaled once each send's process has reported back, after the inbox has it.
        wait_for(
            lambda: (
                {r["event"] for r in kinds_of(run_dir, "alert_sent")} >= {"gpu_fault", "halted"}
            ),
            30,
            what="both sends journaled",
        )
        daemon.stop()
    assert_no_secret(run_dir)
