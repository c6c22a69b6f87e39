"""supervisor/core/records.py against the kinds it types, and the check that holds every
test's daemon journals to it (tests/support/records_check.py, run at each test's end)."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.support.records_check import journals, problems
from trainwarden.supervisor.core.kinds import JOURNAL_KINDS
from trainwarden.supervisor.core.records import record_classes


def test_each_journal_kind_has_exactly_one_record_class():
    assert set(record_classes()) == set(JOURNAL_KINDS)
    assert len(set(record_classes().values())) == len(JOURNAL_KINDS)


DAEMON_START = {"kind": "daemon_start", "pid": 7, "version": "1", "previous_exit_clean": True}
CRASH = {"kind": "crash", "pid": 8, "returncode": 3, "last_step": 350, "cause": "exit 3"}


def write_journal(run: Path, *records: dict) -> Path:
    """In a folder of tmp_path_factory: the end-of-test check reads only tmp_path's."""
    path = run / ".trainwarden" / "journal.jsonl"
    path.parent.mkdir(parents=True)
    stamped = [{"ts": "2026-12-06T00:00:00Z", "t": 1.0, **r} for r in records]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in stamped))
    return path


def test_a_daemons_records_as_written_pass(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("journals")
    big = {"kind": "quarantine", "step": "100000000000000000000", "name": "x", "reason": "r"}
    nan = {**CRASH, "kind": "stall", "last_step": None, "silent_s": "nan"}
    del nan["pid"], nan["returncode"], nan["cause"]
    path = write_journal(tmp_path, DAEMON_START, CRASH, big, nan, {"kind": "new_kind", "a": 1})
    assert problems(path) == []
    assert list(journals(tmp_path)) == [path]


def test_an_undeclared_key_a_missing_key_and_a_wrong_type_are_each_named(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("journals")
    extra = {**CRASH, "step": 350}
    missing = {k: v for k, v in CRASH.items() if k != "cause"}
    wrong = {**CRASH, "returncode": 3.5}
    nested = {"kind": "leftover_processes", "marker": "m", "processes": [{"pid": "1"}]}
    path = write_journal(tmp_path, DAEMON_START, extra, missing, wrong, nested)
    found = problems(path)
    assert len(found) == 4, found
    assert found[0].endswith(":2: crash: undeclared key 'step' (350)")
    assert found[1].endswith(":3: crash: required key 'cause' missing")
    assert found[2].endswith(":4: crash: 'returncode' = 3.5 is not <class 'int'>")
    assert ":5: leftover_processes: 'processes' = [{'pid': '1'}] is not list[" in found[3]


def test_a_journal_a_test_wrote_by_hand_is_not_held_to_the_records(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("journals")
    # No daemon_start with a version: a reader's input, which may be anything.
    path = write_journal(tmp_path, {"kind": "daemon_start"}, {**CRASH, "step": 1})
    assert problems(path) == []
