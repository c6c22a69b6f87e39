import math
import os

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainwarden.supervisor.shell.start_audit import audit_result
from trainwarden.supervisor.store.lossdb import LossWriter, decode_loss, encode_loss
from trainwarden.supervisor.store.losshistory import LossHistory
from trainwarden.supervisor.store.resume_audit import AuditResult, ResumeAudit


@pytest.fixture
def path(tmp_path):
    return tmp_path / ".loss.json"


def write(path, rows):
    with LossWriter(path) as writer:
        for step, loss, seg in rows:
            writer.append(step, loss, 0.25, 1000.0 + step, seg)


def test_lines_have_the_documented_shape(path):
    with LossWriter(path) as writer:
        writer.append(120, 3.41, 0.25, 1717171717.5, 2)
        writer.append(121, 3.40, None, 1717171718.0, 2)
    lines = path.read_bytes().splitlines()
    assert orjson.loads(lines[0]) == {
        "step": 120,
        "loss": 3.41,
        "dt": 0.25,
        "t": 1717171717.5,
        "seg": 2,
    }
    assert orjson.loads(lines[1])["dt"] is None


def test_non_finite_losses_are_strings_and_round_trip(path):
    write(path, [(1, math.nan, 1), (2, math.inf, 1), (3, -math.inf, 1), (4, 2.5, 1)])
    assert [orjson.loads(line)["loss"] for line in path.read_bytes().splitlines()] == [
        "nan", "inf", "-inf", 2.5,
    ]  # fmt: skip
    losses = [row.loss for row in LossHistory.load(path)]
    assert math.isnan(losses[0]) and losses[1:] == [math.inf, -math.inf, 2.5]


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_encode_decode_loss(loss):
    back = decode_loss(orjson.loads(orjson.dumps(encode_loss(loss))))
    assert (math.isnan(loss) and math.isnan(back)) or back == loss


def test_writer_appends_and_never_truncates(path):
    write(path, [(1, 3.0, 1)])
    write(path, [(2, 2.9, 1)])
    assert [row.step for row in LossHistory.load(path)] == [1, 2]


def test_writer_ends_a_torn_line_before_appending(path):
    path.write_bytes(b'{"step":1,"loss":3.0,"dt":0.2,"t":1.0,"seg":1}\n{"step":2,"lo')
    write(path, [(3, 2.8, 2)])
    history = LossHistory.load(path)
    assert [row.step for row in history] == [1, 3]
    assert history.load_stats.garbage == 1 and not history.load_stats.torn_tail


def test_load_tolerates_garbage_and_a_torn_tail(path):
    path.write_bytes(
        b'{"step":1,"loss":3.0,"dt":0.2,"t":1.0,"seg":1}\n'
        b"not json at all\n"
        b"\n"
        b'{"step":"x","loss":3.0,"dt":0.2,"t":1.0,"seg":1}\n'
        b'{"step":2,"loss":2.9,"dt":null,"t":2.0,"seg":1}\n'
        b'{"step":3,"loss":2.'
    )
    history = LossHistory.load(path)
    assert [(row.step, row.loss) for row in history] == [(1, 3.0), (2, 2.9)]
    assert history.load_stats.garbage == 2
    assert history.load_stats.torn_tail


def test_complete_last_line_without_newline_is_kept(path):
    path.write_bytes(b'{"step":1,"loss":3.0,"dt":0.2,"t":1.0,"seg":1}')
    history = LossHistory.load(path)
    assert len(history) == 1 and not history.load_stats.torn_tail


def test_missing_file_is_an_empty_history(path):
    history = LossHistory.load(path)
    assert len(history) == 0 and history.last_step is None


def test_newest_segment_wins_per_step(path):
    write(path, [(1, 3.0, 1), (2, 2.9, 1), (3, 2.8, 1), (4, math.nan, 1)])
    write(path, [(3, 2.75, 2), (4, 2.7, 2)])  # restarted from step 2
    history = LossHistory.load(path)
    assert [tuple(row) for row in history] == [(1, 3.0, 1), (2, 2.9, 1), (3, 2.75, 2), (4, 2.7, 2)]
    assert history.load_stats.superseded == 2
    assert history.last_step == 4


def test_load_across_chunk_boundaries(path, monkeypatch):
    import trainwarden.supervisor.store.losshistory as losshistory

    monkeypatch.setattr(losshistory, "LOAD_CHUNK_BYTES", 7)  # lines straddle every chunk
    write(path, [(step, 3.0 - step / 100, 1) for step in range(1, 51)])
    history = LossHistory.load(path)
    assert len(history) == 50 and history.load_stats.garbage == 0
    assert history.get(50).loss == pytest.approx(2.5)


def test_add_appends_replaces_and_inserts():
    history = LossHistory()
    for step in (1, 2, 3, 5):
        history.add(step, 3.0, 0.25, float(step), seg=1)
    history.add(3, 2.5, 0.25, 10.0, seg=2)  # replayed: newer segment replaces
    history.add(2, 9.9, 0.25, 11.0, seg=0)  # an older segment never does
    history.add(4, 2.4, None, 12.0, seg=2)  # a gap filled in order
    assert [tuple(row) for row in history] == [
        (1, 3.0, 1), (2, 3.0, 1), (3, 2.5, 2), (4, 2.4, 2), (5, 3.0, 1),
    ]  # fmt: skip
    assert history.get(6) is None


def make_history(n, nan_at=()):
    history = LossHistory()
    for step in range(1, n + 1):
        history.add(step, math.nan if step in nan_at else 10.0 - step / n, 0.25, float(step), 1)
    return history


def test_query_decimates_into_buckets():
    history = make_history(1000)
    result = history.query(1, 1000, points=10)
    assert result["count"] == 1000 and (result["first_step"], result["last_step"]) == (1, 1000)
    assert result["step"] == list(range(1, 1001, 100))
    assert result["max"][0] == pytest.approx(10.0 - 1 / 1000)
    assert result["min"][0] == pytest.approx(10.0 - 100 / 1000)
    assert result["mean"][0] == pytest.approx(10.0 - 50.5 / 1000)
    assert result["nonfinite"] == [0] * 10


def test_query_range_and_small_ranges_are_not_decimated():
    result = make_history(1000).query(100, 104, points=50)
    assert result["step"] == [100, 101, 102, 103, 104]
    assert result["min"] == result["mean"] == result["max"]
    assert result["count"] == 5


def test_query_reports_non_finite_without_putting_it_in_the_numbers():
    history = make_history(100, nan_at={15})
    result = history.query(points=10)
    assert result["nonfinite"][1] == 1 and sum(result["nonfinite"]) == 1
    assert all(math.isfinite(v) for v in result["mean"])
    assert orjson.dumps(result)  # strict JSON: no nan anywhere
    single = history.query(15, 15, points=10)
    assert single["mean"] == [None] and single["nonfinite"] == [1]


def test_query_with_gaps_and_empty_ranges():
    history = LossHistory()
    for step in list(range(1, 11)) + list(range(1001, 1011)):
        history.add(step, 1.0, None, 0.0, 1)
    result = history.query(points=4)
    assert len(result["step"]) == 2 and result["count"] == 20  # the empty middle is skipped
    empty = history.query(20, 30, points=4)
    assert empty["count"] == 0 and empty["step"] == [] and empty["first_step"] is None
    with pytest.raises(ValueError):
        history.query(points=0)


@settings(max_examples=50, deadline=None)
@given(
    steps=st.lists(st.integers(0, 500), min_size=1, max_size=200, unique=True),
    points=st.integers(1, 50),
    bounds=st.tuples(st.integers(-10, 510), st.integers(-10, 510)),
)
def test_query_buckets_cover_the_range_exactly(steps, points, bounds):
    history = LossHistory()
    for step in sorted(steps):
        history.add(step, float(step), None, 0.0, 1)
    start, end = min(bounds), max(bounds)
    result = history.query(start, end, points)
    inside = [s for s in steps if start <= s <= end]
    assert result["count"] == len(inside)
    assert len(result["step"]) <= points
    assert result["step"] == sorted(result["step"])
    if inside:
        assert min(result["min"]) == min(inside) and max(result["max"]) == max(inside)


def test_audit_verified_when_replay_matches():
    history = make_history(10)
    audit = ResumeAudit(history, checkpoint_step=6, seg=2)
    assert audit.expected == 4
    results = [audit.observe(step, history.get(step).loss) for step in (7, 8, 9, 10)]
    assert results[:3] == [None, None, None]
    assert results[3] == AuditResult("verified", 6, checked=4, expected=4, seg=2)
    assert audit_result(results[3])["status"] == "verified"
    assert audit.observe(11, 1.0) is None  # handed out once
    assert audit.finish() is None


def test_audit_reports_the_first_drift():
    history = make_history(10)
    audit = ResumeAudit(history, 6, 10, seg=2)
    assert audit.observe(7, history.get(7).loss) is None
    result = audit.observe(8, 1.234)
    assert result.status == "drift" and result.step == 8
    assert (result.old_loss, result.new_loss) == (history.get(8).loss, 1.234)


def test_audit_tolerance():
    assert ResumeAudit({1: 3.0}, 0, tolerance=1e-3).observe(1, 3.0005).status == "verified"
    assert ResumeAudit({1: 3.0}, 0).observe(1, 3.0005).status == "drift"


def test_audit_non_finite_values():
    assert ResumeAudit({1: math.nan}, 0).observe(1, math.nan).status == "verified"
    assert ResumeAudit({1: math.inf}, 0).observe(1, math.inf).status == "verified"
    drift = ResumeAudit({1: 3.0}, 0).observe(1, math.nan)
    assert drift.status == "drift" and audit_result(drift)["new_loss"] == "nan"
    # A non-finite loss superseded by a finite one is a divergence the rollback undid,
    # not a resume that lost state.
    assert ResumeAudit({1: math.nan}, 0, tolerance=1.0).observe(1, 3.0).status == "verified"


def test_audit_trainer_dies_midway():
    audit = ResumeAudit({6: 2.0, 7: 1.9, 8: 1.8}, 5)
    assert audit.observe(6, 2.0) is None
    result = audit.finish()
    assert (result.status, result.checked, result.expected) == ("verified", 1, 3)
    assert ResumeAudit({6: 2.0}, 5).finish().status == "unverified"


def test_audit_with_nothing_to_replay():
    audit = ResumeAudit(make_history(10), checkpoint_step=10)
    assert audit.expected == 0 and audit.result.status == "unverified"
    assert audit.observe(11, 1.0).status == "unverified"  # handed out on the first call
    assert audit.finish() is None


def test_audit_ends_when_the_trainer_logs_past_the_old_steps():
    audit = ResumeAudit({10: 2.0, 20: 1.9}, 0)  # the old run logged every 10 steps
    assert audit.observe(10, 2.0) is None
    assert audit.observe(25, 1.5).status == "verified"


def test_audit_ignores_steps_outside_the_replayed_range():
    audit = ResumeAudit({3: 9.0, 7: 2.0, 8: 1.9, 12: 0.5}, 5, last_step=8)
    assert audit.expected == 2
    assert audit.observe(4, 1.0) is None  # before the checkpoint: not compared
    assert audit.observe(7, 2.0) is None
    assert audit.observe(8, 1.9).status == "verified"


def test_audit_copies_the_old_values_before_the_replay_overwrites_them():
    history = make_history(10)
    audit = ResumeAudit(history, 8, seg=2)
    old = history.get(9).loss
    history.add(9, 0.123, 0.25, 99.0, seg=2)
    assert audit.observe(9, 0.123) == AuditResult(
        "drift", 8, checked=1, expected=2, seg=2, step=9, old_loss=old, new_loss=0.123
    )


def test_recent_steps_for_warming_the_monitor():
    history = make_history(10)
    history.add(11, 1.0, None, 11.0, 1)
    recent = history.recent(3)
    assert [r.step for r in recent] == [9, 10, 11]
    assert recent[-1].dt_s is None and recent[0].dt_s == 0.25
    assert len(history.recent(100)) == 11


def test_large_history_round_trip(path):
    with LossWriter(path) as writer:
        for step in range(1, 20_001):
            writer.append(step, 5.0 - step * 1e-4, 0.25, 1e9 + step, 1 + step // 10_000)
    history = LossHistory.load(path)
    assert len(history) == 20_000 and history.last_step == 20_000
    assert history.query(points=100)["count"] == 20_000
    assert os.path.getsize(path) > 0


def test_block_load_matches_the_line_by_line_load(tmp_path, monkeypatch):
    path = tmp_path / ".loss.json"
    with LossWriter(path) as writer:
        # ~2 MB: the first 1 MB chunk is clean (block path, a step without dt in it), the
        # last is not (a nan loss: line by line).
        for step in range(1, 30_001):
            loss = float("nan") if step == 29_000 else 5.0 - step * 1e-4
            writer.append(step, loss, None if step == 100 else 0.25, 1e9 + step, 1)
    with open(path, "ab") as f:
        f.write(b'{"step": "7", "loss": 1.0, "dt": 0.1, "t": 1.0, "seg": 1}\n')  # a string step
        f.write(b'{"step": true, "loss": 1.0, "dt": 0.1, "t": 1.0, "seg": 1}\n')  # a bool step
    blocks = []
    original = LossHistory._read_clean_block

    def spy(self, lines):
        blocks.append(original(self, lines))
        return blocks[-1]

    monkeypatch.setattr(LossHistory, "_read_clean_block", spy)
    fast = LossHistory.load(path)
    assert True in blocks and False in blocks  # both paths ran
    monkeypatch.setattr(LossHistory, "_read_clean_block", lambda self, lines: False)
    careful = LossHistory.load(path)
    assert fast.load_stats == careful.load_stats
    assert fast.load_stats.garbage == 2
    assert math.isnan(fast._dt[99]) and fast._dt[100] == 0.25
    for a, b in zip(fast._columns(), careful._columns(), strict=True):
        assert a.tobytes() == b.tobytes()
