"""Each quarantined file's reason in words, from the journal: a pivot's set-aside
checkpoints calm, a failed verification alarming, and still so after a daemon restart."""

from __future__ import annotations

from pathlib import Path

from tests.support import running_daemon, scripted_run, wait_for
from trainwarden.supervisor.store import quarantine

RUNNING = ("--steps", "100000000", "--save-every", "25", "--dt", "0.02")


def test_reasons_in_words_for_each_cause_and_for_records_from_before_causes():
    records = {
        "step_000100.bin": {
            "kind": "quarantine",
            "step": 100,
            "name": "step_000100.bin",
            "reason": "written under the old policy after pivot step 8400",
            "cause": "pivot",
            "cause_step": 8400,
        },
        # Journaled before causes were: the reason's words still tell.
        "step_000200.bin": {
            "kind": "quarantine",
            "step": 200,
            "name": "step_000200.bin",
            "reason": "written under the old policy after pivot step 9000",
        },
        "step_000300.bin": {
            "kind": "quarantine",
            "step": 300,
            "name": "step_000300.bin",
            "reason": "size 10 != 12008 from the header",
            "cause": "verification",
        },
        "step_000400.bin": {
            "kind": "quarantine",
            "step": 400,
            "name": "step_000400.bin",
            "reason": "written at or after divergence at step 390",
        },
    }
    notes = {name: quarantine.note_of(r) for name, r in records.items()}
    files = [
        "step_000100.bin",
        "step_000100.json",  # its sidecar, moved with it
        "step_000200.bin",
        "step_000300.bin",
        "step_000300.bin.20260101T000000",  # a second copy under the same name
        "step_000400.bin",
        "stranger.bin",
    ]
    told = {e["name"]: (e["why"], e["alarming"]) for e in quarantine.entries(files, notes)}
    assert told == {
        "step_000100.bin": ("set aside by the pivot at step 8,400", False),
        "step_000100.json": ("set aside by the pivot at step 8,400", False),
        "step_000200.bin": ("set aside by the pivot at step 9,000", False),
        "step_000300.bin": ("failed verification: size 10 != 12008 from the header", True),
        "step_000300.bin.20260101T000000": (
            "failed verification: size 10 != 12008 from the header",
            True,
        ),
        "step_000400.bin": ("rolled back: written at or after the divergence at step 390", True),
        "stranger.bin": ("no reason in the journal", True),
    }


def test_the_daemon_lists_a_failed_verification_with_its_reason_across_a_restart(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", *RUNNING)

    def quarantined(daemon) -> list[dict]:
        return daemon.request("checkpoints")["quarantined"]

    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running")
        (run_dir / "checkpoints" / "step_000001.bin").write_bytes(b"\x01\x00\x00\x00 short")
        (entry,) = wait_for(lambda: quarantined(daemon), 60, what="the planted file quarantined")
        assert entry["name"] == "step_000001.bin" and entry["alarming"] is True
        assert entry["why"].startswith("failed verification: "), entry
        daemon.request("shutdown", timeout=120)
        assert daemon.wait_exit(60) == 0
    with running_daemon(run_dir) as daemon:
        assert quarantined(daemon) == [entry]
        daemon.request("shutdown", timeout=120)
