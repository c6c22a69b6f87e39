"""A fast crash loop's cycles are counted, not journaled one by one (store.repeats): the
fold itself, a starting daemon's reading of it, and a real daemon whose trainer dies at once
with no backoff."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.daemon import running_daemon
from tests.support.runs import PYTHON, journal, make_run
from tests.support.wait import wait_for
from trainwarden.supervisor.journal_text import summary
from trainwarden.supervisor.shell.boot import last_state_record
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.repeats import FOLD_AFTER, signature


def crash(cause: str = "exit status 3", line: str = "boom") -> dict[str, Any]:
    return {"pid": 1, "returncode": 3, "last_step": None, "cause": cause, "last_line": line}


def cycle(j: Journal, seg: int, t: float, **crashed: Any) -> None:
    """One turn of a crash loop, as the daemon journals it."""
    state = {"phase": "starting", "seg": seg, "restarts": seg - 1}
    j.append({"kind": "state", "state": state}, t=t)
    j.append({"kind": "spawn", "seg": seg, "resume": None, "marker": f"{seg}-x"}, t=t, sync=True)
    j.append({"kind": "trainer_started", "pid": 100 + seg, "seg": seg}, t=t)
    j.append({"kind": "state", "state": {**state, "restarts": seg}}, t=t)
    j.append({"kind": "crash", **crash(**crashed)}, t=t)
    j.append({"kind": "restart_scheduled", "backoff_s": 0.0, "attempt": seg}, t=t)


def test_identical_quiet_crashes_are_counted_after_the_first_few(tmp_path: Path):
    (tmp_path / ".trainwarden").mkdir()
    j = Journal(tmp_path / ".trainwarden" / "journal.jsonl")
    j.fold_repeats(quiet=lambda: True)
    for seg in range(1, 101):
        cycle(j, seg, t=1000.0 + seg)
    j.append({"kind": "halt", "state": "crash_loop"}, t=1200.0)
    records = journal(tmp_path)
    assert [r["kind"] for r in records].count("crash") == FOLD_AFTER
    repeated = [r for r in records if r["kind"] == "repeated"]
    # Reported at 1, 2, 4, ... 64 folded crashes and when the halt ended it.
    assert [r["cycles"] for r in repeated] == [1, 2, 4, 8, 16, 32, 64, 95]
    assert [r["ongoing"] for r in repeated] == [True] * 7 + [False]
    final = repeated[-1]
    assert final["counts"]["crash"] + FOLD_AFTER == 100
    assert final["counts"]["spawn"] == 95 and final["counts"]["state"] == 190
    assert final["last"]["state"]["state"]["seg"] == 100
    assert final["last"]["spawn"]["seg"] == 100
    assert [r["kind"] for r in records][-2:] == ["repeated", "halt"]
    assert summary(final) == "95 more crashes like the last (exit status 3, last line: boom)"
    # What a starting daemon reads: the newest state and start the fold counted.
    tail = last_state_record(j.path)
    assert tail.state is not None and tail.state["seg"] == 100 and tail.spawned_seg == 100
    assert not tail.clean


def test_a_different_crash_a_start_that_logged_steps_or_another_record_ends_the_fold(
    tmp_path: Path,
):
    (tmp_path / ".trainwarden").mkdir()
    j = Journal(tmp_path / ".trainwarden" / "journal.jsonl")
    logged = [False]
    j.fold_repeats(quiet=lambda: not logged[0])
    t = 1000.0
    for seg in range(1, 9):
        cycle(j, seg, t=t)
    cycle(j, 9, t=t, cause="killed by SIGKILL")  # another crash: written, fold over
    logged[0] = True
    for seg in range(10, 20):
        cycle(j, seg, t=t)  # these starts logged steps: never folded
    logged[0] = False
    for seg in range(20, 28):
        cycle(j, seg, t=t)
    j.append({"kind": "operator", "cmd": "stop"}, t=t)  # anything else ends it
    for seg in range(28, 31):
        cycle(j, seg, t=t)
    crashes = [r for r in journal(tmp_path) if r["kind"] == "crash"]
    # 5 + 1 + 10 + 5 + 3 written, the rest (3 and 3) counted.
    assert len(crashes) == 24
    repeated = [r for r in journal(tmp_path) if r["kind"] == "repeated"]
    assert [r["cycles"] for r in repeated] == [1, 2, 3, 1, 2, 3]
    assert [r["ongoing"] for r in repeated] == [True, True, False] * 2


def test_a_last_line_that_names_a_pid_or_a_time_is_still_the_same_crash(tmp_path: Path):
    """Found by trying: a trainer whose last line names its pid wrote every cycle out
    (780 KB in 10 s): the line counts with its numbers taken out."""
    (tmp_path / ".trainwarden").mkdir()
    j = Journal(tmp_path / ".trainwarden" / "journal.jsonl")
    j.fold_repeats(quiet=lambda: True)
    for seg in range(1, 41):
        cycle(j, seg, t=1000.0 + seg, line=f"boom in pid {4000 + seg} at 12:{seg:02d}:07")
    j.append({"kind": "halt", "state": "crash_loop"}, t=1100.0)
    records = journal(tmp_path)
    assert sum(r["kind"] == "crash" for r in records) == FOLD_AFTER
    (final,) = [r for r in records if r["kind"] == "repeated" and not r["ongoing"]]
    assert final["cycles"] == 40 - FOLD_AFTER
    assert final["last"]["crash"]["last_line"] == "boom in pid 4040 at 12:40:07"  # as written
    # Another message is another crash.
    assert signature(crash(line="boom in pid 1")) == signature(crash(line="boom in pid 22"))
    assert signature(crash(line="boom")) != signature(crash(line="bang"))


def test_a_durable_record_is_never_folded_and_a_long_fold_reports_every_few_minutes(
    tmp_path: Path,
):
    (tmp_path / ".trainwarden").mkdir()
    j = Journal(tmp_path / ".trainwarden" / "journal.jsonl")
    j.fold_repeats(quiet=lambda: True)
    for seg in range(1, 7):
        cycle(j, seg, t=1000.0 + seg)
    # A state that must survive a power cut (a pivot's stage) is written, ending the fold.
    j.append(
        {"kind": "state", "state": {"seg": 6, "pivot": {"stage": "archived"}}}, t=1010.0, sync=True
    )
    states = [r for r in journal(tmp_path) if r["kind"] == "state"]
    assert states[-1]["state"].get("pivot") == {"stage": "archived"}
    j.fold = None
    (tmp_path / ".trainwarden" / "journal.jsonl").unlink()
    j = Journal(tmp_path / ".trainwarden" / "journal.jsonl")
    j.fold_repeats(quiet=lambda: True)
    for k in range(1, 40):  # a crash a minute, for 39 minutes
        cycle(j, k, t=1000.0 + 60 * k)
    reports = [r for r in journal(tmp_path) if r["kind"] == "repeated"]
    times = [r["t"] for r in reports]
    assert all(b - a <= 300 + 60 for a, b in zip(times, times[1:], strict=False)), times
    j.close()
    assert journal(tmp_path)[-1]["kind"] == "repeated"
    assert journal(tmp_path)[-1]["ongoing"] is False


def crash_loop_run(run_dir: Path, budget: int) -> Path:
    """A trainer that prints one line and exits 3 at once, restarted with no backoff up to
    `budget` times without progress."""
    return make_run(
        run_dir,
        [PYTHON, "-S", "-c", "print('boom'); raise SystemExit(3)"],
        restart={
            "backoff_initial_s": 0.0,
            "backoff_max_s": 0.0,
            "max_restarts_without_progress": budget,
        },
    )


def test_a_fast_crash_loop_under_the_daemon_grows_the_journal_by_counts(tmp_path: Path):
    """A trainer that dies at once, no backoff, a huge restart budget: hundreds of cycles,
    a journal of a few KB (about 1.8 KB a cycle before); the daemon killed mid-fold goes
    on from the last report, and a finite budget still halts the loop in crash_loop."""
    run_dir = crash_loop_run(tmp_path / "run", budget=1_000_000)
    path = run_dir / ".trainwarden" / "journal.jsonl"
    with running_daemon(run_dir) as daemon:

        def crashes() -> int:
            records = journal(run_dir)
            reports = [r["cycles"] for r in records if r["kind"] == "repeated"]
            return sum(r["kind"] == "crash" for r in records) + (reports[-1] if reports else 0)

        wait_for(lambda: crashes() >= 100, 120, 0.05, what="100 crashes")
        size, seen = path.stat().st_size, crashes()
        assert size < 40_000, (size, seen)
        daemon.kill()
    # The budget counts restarts without progress (`restarts` also counts the new
    # daemon's start, and is one behind between a crash and its restart).
    reported = max(
        (
            r["last"]["state"]["state"]["restarts_without_progress"]
            for r in journal(run_dir)
            if r["kind"] == "repeated"
        ),
        default=0,
    )
    crash_loop_run(run_dir, budget=reported + 30)
    with running_daemon(run_dir) as daemon:
        status = daemon.wait_state("crash_loop", timeout=120)
        assert status["restarts_without_progress"] == reported + 30
        assert status["restarts"] >= reported + 30
        daemon.stop()
    records = journal(run_dir)
    started = max(i for i, r in enumerate(records) if r["kind"] == "daemon_start")
    after = records[started:]
    assert after[-1]["kind"] == "daemon_exit"
    halt = next(r for r in after if r["kind"] == "halt")
    assert halt["state"] == "crash_loop"
    # Every crash of the second daemon is journaled or counted.
    written = sum(r["kind"] == "crash" for r in after)
    counted = sum(r["cycles"] for r in after if r["kind"] == "repeated" and not r["ongoing"])
    assert written + counted == 31, (written, counted)
