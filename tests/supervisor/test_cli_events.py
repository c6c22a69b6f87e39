"""`trainwarden events`: the journal as the TUI summarises it, one line per record, state
snapshots left out of the text view unless asked for; filters by kind and time; --json for
the records as written; read from the journal file when no daemon answers (--follow then
refused in one line). In process against a hand-written journal, then once against a real
daemon over the scripted trainer."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest

from tests.support import running_daemon, scripted_run, wait_for
from trainwarden.supervisor.cli.main import main
from trainwarden.supervisor.store.journal import utc_now

STATE = {"phase": "running", "seg": 2, "restarts": 1, "halt_reason": None, "x": "y" * 500}


class Journal(NamedTuple):
    now: float
    """When the records were written: their ages count from it (and --since from the clock
    of the command, a moment later)."""
    records: list[dict[str, Any]]


def record(now: float, kind: str, age_s: float, **fields: Any) -> dict[str, Any]:
    t = round(now - age_s, 6)
    return {"ts": utc_now(t), "t": t, "kind": kind, **fields}


@pytest.fixture
def written() -> Journal:
    now = time.time()
    return Journal(
        now,
        [
            record(now, "daemon_start", 7200, pid=11),
            record(now, "state", 7199, state=STATE),
            record(now, "spawn", 7198, seg=1, resume=None, pid=12),
            record(now, "crash", 3600, cause="exit status 3", step=350),
            record(now, "state", 3599, state=STATE),
            record(
                now, "spawn", 3598, seg=2, resume={"step": 300, "name": "step_000300.bin"}, pid=13
            ),
            record(now, "checkpoint", 600, step=400, name="step_000400.bin"),
            record(now, "delete", 599, step=100, name="step_000100.bin"),
            record(now, "state", 598, state=STATE),
            record(now, "spike", 60, first_step=100, step=102, peak=15.0, threshold=6.5),
        ],
    )


@pytest.fixture
def run_dir(tmp_path: Path, written: Journal) -> Path:
    """A run with a config and a journal, and no daemon."""
    run = scripted_run(tmp_path / "run", "--steps", "5")
    (run / ".trainwarden").mkdir(exist_ok=True)
    lines = b"".join(orjson.dumps(r) + b"\n" for r in written.records)
    (run / ".trainwarden" / "journal.jsonl").write_bytes(lines + b'{"torn')
    return run


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def clock(r: dict[str, Any]) -> str:
    return datetime.fromtimestamp(r["t"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_without_a_daemon_the_text_view_reads_the_journal_file_and_leaves_out_state(
    run_dir: Path, written: Journal, capsys: pytest.CaptureFixture[str]
):
    code, out, err = run_main(capsys, "events", str(run_dir))
    assert code == 0, err
    lines = out.splitlines()
    shown = [r for r in written.records if r["kind"] != "state"]
    assert len(lines) == len(shown)
    for line, r in zip(lines, shown, strict=True):
        assert line.startswith(f"{clock(r)}  {r['kind']} "), line
    # The TUI's summaries: a crash by its cause, a spawn by what it resumed from, a spike by
    # its peak and steps; deletes are listed here (the TUI's panel leaves them out).
    assert lines[2].endswith("crash              exit status 3 step=350")
    assert lines[3].endswith("seg 2, resume from step 300")
    assert "delete             step=100 name=step_000100.bin" in lines[5]
    assert lines[6].endswith(
        "spike              loss 15.0000 from step 100 to 102, above 6.5000 first_step=100 step=102 peak=15.0 threshold=6.5"
    )
    assert "state" not in out and "yyyy" not in out
    assert err.strip() == (
        f"trainwarden: no daemon answers: read from {run_dir / '.trainwarden' / 'journal.jsonl'}"
    )


def test_kind_asks_for_state_snapshots_and_filters_repeated_or_comma_separated(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
):
    code, out, _ = run_main(capsys, "events", str(run_dir), "--kind", "state")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 3 and all("  state  " in line for line in lines)
    assert lines[0].split("state", 1)[1].strip().startswith("running, seg 2, restarts 1")
    for argv in (["--kind", "crash,spawn"], ["--kind", "crash", "--kind", "spawn"]):
        code, out, _ = run_main(capsys, "events", str(run_dir), *argv)
        assert code == 0
        kinds = [line.split()[1] for line in out.splitlines()]
        assert kinds == ["spawn", "crash", "spawn"]


@pytest.mark.parametrize("since", ["15m", "90m", "1d"])
def test_since_takes_a_duration(
    run_dir: Path, written: Journal, capsys: pytest.CaptureFixture[str], since: str
):
    code, out, _ = run_main(capsys, "events", str(run_dir), "--since", since, "--json")
    assert code == 0
    limit = {"15m": 900, "90m": 5400, "1d": 86400}[since]
    expected = [r for r in written.records if r["t"] >= written.now - limit]
    assert len(expected) > 0
    assert [orjson.loads(line) for line in out.splitlines()] == expected


def test_since_takes_an_iso_time_and_refuses_anything_else(
    run_dir: Path, written: Journal, capsys: pytest.CaptureFixture[str]
):
    at = datetime.fromtimestamp(written.now - 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    code, out, _ = run_main(capsys, "events", str(run_dir), "--since", at, "--kind", "delete")
    assert code == 0 and [line.split()[1] for line in out.splitlines()] == ["delete"]
    code, out, _ = run_main(capsys, "events", str(run_dir), "--since", at[:-1], "-n", "100")
    assert code == 0 and len(out.splitlines()) == 3  # no zone: UTC, as printed
    code, out, err = run_main(capsys, "events", str(run_dir), "--since", "yesterday")
    assert code == 2 and out == ""
    assert "--since 'yesterday'" in err and "10m" in err and "2024-05-01T12:00" in err


def test_json_prints_every_kind_as_written_and_n_counts_what_is_shown(
    run_dir: Path, written: Journal, capsys: pytest.CaptureFixture[str]
):
    code, out, _ = run_main(capsys, "events", str(run_dir), "--json")
    assert code == 0 and [orjson.loads(line) for line in out.splitlines()] == written.records
    code, out, _ = run_main(capsys, "events", str(run_dir), "-n", "2")
    assert code == 0 and [line.split()[1] for line in out.splitlines()] == ["delete", "spike"]


def test_follow_needs_the_daemon(run_dir: Path, capsys: pytest.CaptureFixture[str]):
    code, out, err = run_main(capsys, "events", str(run_dir), "--follow")
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("trainwarden: --follow needs the daemon, and no trainwarden daemon")


def test_a_daemon_serves_the_same_views(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    run = scripted_run(tmp_path / "run", "--steps", "100000000", "--save-every", "20")
    with running_daemon(run) as daemon:
        daemon.wait_state("running")
        # Enough deletes and state snapshots that the newest 5 of all kinds hold no spawn.
        wait_for(
            lambda: (
                [r["kind"] for r in daemon.request("events", n=100)["events"][-5:]].count("spawn")
                == 0
            ),
            120,
            what="five records after the spawn",
        )
        code, out, err = run_main(capsys, "events", str(run), "-n", "5")
        assert code == 0 and err == ""
        assert len(out.splitlines()) == 5 and "  state " not in out
        code, out, _ = run_main(capsys, "events", str(run), "--kind", "spawn,daemon_start")
        assert [line.split()[1] for line in out.splitlines()] == ["daemon_start", "spawn"]
        assert out.splitlines()[1].endswith("seg 1, fresh start")
        code, out, _ = run_main(capsys, "events", str(run), "--kind", "state", "--json")
        assert out and all(orjson.loads(line)["kind"] == "state" for line in out.splitlines())
