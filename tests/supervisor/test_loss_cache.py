"""The loss history over its binary cache: queries, audits and replays give exactly what
the history file alone gives; a cache that no longer describes the file counts for nothing.
"""

from __future__ import annotations

import gc
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainwarden.supervisor.store import losscache, losshistory
from trainwarden.supervisor.store.lossdb import LossWriter
from trainwarden.supervisor.store.losshistory import LossHistory
from trainwarden.supervisor.store.resume_audit import ResumeAudit

Record = tuple[int, float, int]  # step, loss, seg

LOSSES = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 2.5]),
)
RECORDS = st.lists(st.tuples(st.integers(0, 80), LOSSES, st.integers(1, 4)), max_size=120)


def write(path: Path, records: list[Record]) -> None:
    with LossWriter(path) as writer:
        writer.append_many(
            [(step, loss, 0.25, 1e9 + i, seg) for i, (step, loss, seg) in enumerate(records)]
        )


def resolved(records: list[Record]) -> dict[int, tuple[float, int]]:
    """The newest segment's loss per step; the later record on a tie."""
    newest: dict[int, tuple[float, int]] = {}
    for step, loss, seg in records:
        if step not in newest or seg >= newest[step][1]:
            newest[step] = (loss, seg)
    return newest


def reference_query(
    rows: dict[int, tuple[float, int]], start: int | None, end: int | None, points: int
) -> dict:
    steps = sorted(s for s in rows if (start is None or s >= start) and (end is None or s <= end))
    out: dict = {"step": [], "min": [], "mean": [], "max": [], "nonfinite": []}
    if not steps:
        return {**out, "first_step": None, "last_step": None, "count": 0}
    first, last = steps[0], steps[-1]
    if len(steps) <= points:
        buckets = [[s] for s in steps]
    else:
        span = last - first + 1
        edges = [first + span * k // points for k in range(points)] + [last + 1]
        buckets = [
            [s for s in steps if lo <= s < hi] for lo, hi in zip(edges, edges[1:], strict=False)
        ]
    for bucket in buckets:
        if not bucket:
            continue
        losses = [rows[s][0] for s in bucket]
        finite = [x for x in losses if math.isfinite(x)]
        out["step"].append(bucket[0])
        out["min"].append(min(finite) if finite else None)
        out["max"].append(max(finite) if finite else None)
        out["mean"].append(math.fsum(finite) / len(finite) if finite else None)
        out["nonfinite"].append(len(losses) - len(finite))
    return {**out, "first_step": first, "last_step": last, "count": len(steps)}


def assert_same_query(got: dict, want: dict) -> None:
    for key in ("step", "min", "max", "nonfinite", "first_step", "last_step", "count"):
        assert got[key] == want[key], key
    assert len(got["mean"]) == len(want["mean"])
    for a, b in zip(got["mean"], want["mean"], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a == pytest.approx(b, rel=1e-9, abs=1e-9)


def same_history(a: LossHistory, b: LossHistory) -> None:
    for x, y in zip(a._columns(), b._columns(), strict=True):
        assert x.tobytes() == y.tobytes()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    records=RECORDS,
    cut=st.integers(0, 120),
    live=st.lists(st.tuples(st.integers(0, 100), LOSSES, st.integers(1, 6)), max_size=40),
    start=st.none() | st.integers(0, 90),
    end=st.none() | st.integers(0, 90),
    points=st.integers(1, 30),
)
def test_a_history_over_its_cache_answers_as_the_file_alone(
    tmp_path_factory, records, cut, live, start, end, points
):
    directory = tmp_path_factory.mktemp("h")
    path, cache = directory / ".loss.json", directory / "loss-cache"
    cut = min(cut, len(records))
    write(path, records[:cut])
    LossHistory.load(path, cache).save_cache(path, cache)
    write(path, records[cut:])
    over_cache = LossHistory.load(path, cache)
    alone = LossHistory.load(path)
    assert over_cache.load_stats == alone.load_stats
    same_history(over_cache, alone)
    reference = resolved(records)
    assert [(r.step, r.seg) for r in over_cache] == [
        (s, reference[s][1]) for s in sorted(reference)
    ]
    before = over_cache.snapshot()
    before_answer = before.query(None, None, 7)
    for i, (step, loss, seg) in enumerate(live):  # live steps, replays, split mapped ranges
        over_cache.add(step, loss, 0.1, 2e9, seg)
        alone.add(step, loss, 0.1, 2e9, seg)
        if i % 3 == 0:  # snapshots between changes: only what changed is copied again
            want = reference_query(resolved(records + live[: i + 1]), None, None, 7)
            assert_same_query(over_cache.query(None, None, 7), want)
    assert before.query(None, None, 7) == before_answer  # a snapshot never changes
    same_history(over_cache, alone)
    rows = resolved(records + live)
    assert_same_query(
        over_cache.query(start, end, points), reference_query(rows, start, end, points)
    )
    assert len(over_cache) == len(rows)
    assert over_cache.last_step == max(rows, default=None)
    if rows:
        step = sorted(rows)[len(rows) // 2]
        got = over_cache.get(step)
        assert got is not None and got.seg == rows[step][1]
        assert math.isnan(got.loss) if math.isnan(rows[step][0]) else got.loss == rows[step][0]
        lo = sorted(rows)[0]
        between = over_cache.losses_between(lo, step)
        assert sorted(between) == [s for s in sorted(rows) if lo < s <= step]
        recent = over_cache.recent(5)
        assert [r.step for r in recent] == sorted(rows)[-5:]


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    records=st.lists(st.tuples(st.integers(0, 200), LOSSES, st.integers(1, 4)), max_size=300),
    cut=st.integers(0, 300),
    chunk_rows=st.integers(1, 40),
    junk=st.sampled_from([b"", b"not json\n", b'{"step": 7, "loss": 1.0']),
)
def test_a_load_that_builds_the_cache_chunk_by_chunk_answers_as_the_file_alone(
    tmp_path_factory, records, cut, chunk_rows, junk
):
    directory = tmp_path_factory.mktemp("b")
    path, cache = directory / ".loss.json", directory / "loss-cache"
    cut = min(cut, len(records))
    write(path, records[:cut])  # a cache for a prefix, or (cut 0) none at all
    if cut:
        LossHistory.load(path, cache).save_cache(path, cache)
    write(path, records[cut:])  # replays reach back into the cache and into earlier chunks
    with open(path, "ab") as f:
        f.write(junk)
    alone = LossHistory.load(path)
    built = LossHistory.load(path, cache, cache_rows=1, chunk_rows=chunk_rows)
    assert built.load_stats == alone.load_stats
    same_history(built, alone)
    if len(built):
        assert built.in_memory_rows() == 0  # all of it mapped
    again = LossHistory.load(path, cache)
    assert again.parsed_rows == 0 and again.load_stats == alone.load_stats
    same_history(again, alone)
    assert len(list(cache.glob("gen-*"))) <= 1


def test_a_history_over_a_cache_with_replays_saves_a_cache_of_the_same_rows(tmp_path):
    path, cache = tmp_path / ".loss.json", tmp_path / "loss-cache"
    write(path, [(s, float(s), 1) for s in range(1, 3001)])
    LossHistory.load(path, cache).save_cache(path, cache)
    write(path, [(s, -float(s), 2) for s in range(1000, 1011)])  # replays mid-cache
    over = LossHistory.load(path, cache)
    assert [type(p).__name__ for p in over._parts] == ["_Mapped", "_Live", "_Mapped"]
    assert over.save_cache(path, cache)
    again = LossHistory.load(path, cache)
    assert again.parsed_rows == 0
    same_history(again, LossHistory.load(path))


REFRESH = 50


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    live=st.lists(st.tuples(st.integers(0, 400), LOSSES, st.integers(1, 6)), max_size=600),
    during=st.integers(0, 20),
    points=st.integers(1, 30),
)
def test_a_live_history_remapped_after_each_rebuild_holds_only_the_rows_since(
    tmp_path_factory, live, during, points
):
    """The daemon's loop, without the loop: every REFRESH logged rows a rebuild of the cache
    for what the file held then, `during` rows logged while it runs, then the remap."""
    directory = tmp_path_factory.mktemp("r")
    path, cache = directory / ".loss.json", directory / "loss-cache"
    history = LossHistory.load(path, cache)
    pending: tuple[int, int] | None = None  # (upto, rows logged since the mark)
    snapshot = None
    with LossWriter(path) as writer:
        for i, (step, loss, seg) in enumerate(live):
            history.add(step, loss, 0.25, 1e9 + i, seg)
            writer.append(step, loss, 0.25, 1e9 + i, seg)
            if pending is not None:
                upto, since = pending
                pending = (upto, since + 1)
                if since + 1 >= during:
                    snapshot = history.snapshot()
                    answer = snapshot.query(None, None, points)
                    base = LossHistory.load(path, cache, upto=upto, cache_rows=1)
                    assert history.remap(base)
                    assert snapshot.query(None, None, points) == answer  # still valid
                    pending = None
            elif (i + 1) % REFRESH == 0:
                size = writer.size()
                assert size is not None
                history.mark()
                pending = (size, 0)
            assert history.in_memory_rows() <= REFRESH + during + 1
    alone = LossHistory.load(path)
    same_history(history, alone)
    rows = resolved(live)
    assert_same_query(history.query(None, None, points), reference_query(rows, None, None, points))
    assert len(list(cache.glob("gen-*"))) <= 1


def test_nothing_maps_an_old_generation_once_its_history_and_snapshots_let_go(tmp_path):
    path, cache = tmp_path / ".loss.json", tmp_path / "loss-cache"
    long_run(path, 3000)
    history = LossHistory.load(path, cache, cache_rows=1)
    with LossWriter(path) as writer:
        for s in range(3001, 3101):
            history.add(s, 1.0, 0.25, 2e9, 1)
            writer.append(s, 1.0, 0.25, 2e9, 1)
        size = writer.size()
    snapshot = history.snapshot()
    history.mark()
    assert history.remap(LossHistory.load(path, cache, upto=size, cache_rows=1))
    assert history.in_memory_rows() == 0

    def deleted_maps() -> list[str]:
        maps = Path("/proc/self/maps").read_text().splitlines()
        return [m for m in maps if str(cache) in m and m.endswith("(deleted)")]

    assert deleted_maps()  # the snapshot still reads the unlinked generation
    assert snapshot.query(None, None, 10)["count"] == 3100
    del snapshot
    gc.collect()
    assert deleted_maps() == []


def test_the_first_load_of_a_long_history_holds_one_chunk_in_memory(tmp_path, monkeypatch):
    path, cache = tmp_path / ".loss.json", tmp_path / "loss-cache"
    steps = 200_000
    long_run(path, steps)
    # Small reads, so that the parse's own temporaries (a few MB per MB read) stay small
    # beside the rows themselves.
    monkeypatch.setattr(losshistory, "LOAD_CHUNK_BYTES", 64 << 10)

    def peak_of(load) -> tuple[LossHistory, int]:
        tracemalloc.start()
        try:
            history = load()
            return history, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    alone, alone_peak = peak_of(lambda: LossHistory.load(path))
    built, built_peak = peak_of(
        lambda: LossHistory.load(path, cache, cache_rows=1, chunk_rows=10_000)
    )
    print(
        f"peak for {steps} rows: {alone_peak / 1e6:.1f} MB all in memory, {built_peak / 1e6:.1f} MB building the cache"
    )
    assert len(built) == steps and built.in_memory_rows() == 0
    same_history(built, alone)
    # All the rows at once are 40 bytes a row (8 MB); a chunk of 10,000 is 0.4 MB.
    assert alone_peak > 40 * steps
    assert built_peak < 15 * steps


def long_run(path: Path, steps: int, seg: int = 1, first: int = 1) -> None:
    with LossWriter(path) as writer:
        writer.append_many(
            [(s, 5.0 - s * 1e-4, 0.25, 1e9 + s, seg) for s in range(first, first + steps)]
        )


def test_the_cache_is_mapped_and_only_the_lines_after_it_are_parsed(tmp_path):
    path, cache = tmp_path / ".loss.json", tmp_path / "loss-cache"
    long_run(path, 5000)
    assert LossHistory.load(path, cache).save_cache(path, cache)
    long_run(path, 10, first=5001)
    history = LossHistory.load(path, cache)
    assert history.parsed_rows == 10
    assert isinstance(history._parts[0].base[0], np.memmap)
    assert len(history) == 5010 and history.load_stats.lines == 5010


def test_a_truncated_history_file_voids_the_cache(tmp_path):
    path, cache = tmp_path / ".loss.json", tmp_path / "loss-cache"
    long_run(path, 3000)
    LossHistory.load(path, cache).save_cache(path, cache)
    path.unlink()
    long_run(path, 1000)  # shorter than the prefix the cache resolves
    history = LossHistory.load(path, cache)
    assert history.parsed_rows == 1000 and len(history) == 1000
    assert history.last_step == 1000


def test_a_rewritten_history_file_of_the_same_length_voids_the_cache(tmp_path):
    path, cache = tmp_path / ".loss.json", tmp_path / "loss-cache"
    long_run(path, 3000, seg=1)
    LossHistory.load(path, cache).save_cache(path, cache)
    size = path.stat().st_size
    path.unlink()
    long_run(path, 3000, seg=2)  # same length, other content
    assert path.stat().st_size == size
    history = LossHistory.load(path, cache)
    assert history.parsed_rows == 3000
    assert {row.seg for row in history} == {2}


def test_a_torn_tail_after_the_cache_is_skipped_and_not_cached(tmp_path):
    path, cache = tmp_path / ".loss.json", tmp_path / "loss-cache"
    long_run(path, 3000)
    LossHistory.load(path, cache).save_cache(path, cache)
    with open(path, "ab") as f:
        f.write(b'{"step": 3001, "loss": 1.0, "dt": 0.2')  # a writer killed mid-line
    history = LossHistory.load(path, cache)
    assert history.load_stats.torn_tail and len(history) == 3000
    assert history.load_stats == LossHistory.load(path).load_stats
    # A readable last line without its newline is read, but stays outside a new cache.
    path.write_bytes(
        path.read_bytes()[: -len(b', "dt": 0.2')] + b', "dt": 0.2, "t": 1.0, "seg": 1}'
    )
    history = LossHistory.load(path, cache)
    assert history.last_step == 3001 and not history.save_cache(path, cache)


def test_a_crash_while_writing_the_cache_leaves_the_previous_one_in_force(tmp_path, monkeypatch):
    path, cache = tmp_path / ".loss.json", tmp_path / "loss-cache"
    long_run(path, 3000)
    LossHistory.load(path, cache).save_cache(path, cache)
    long_run(path, 2000, first=3001)

    def dies_mid_generation(builder, *args):
        (builder.gen / "loss.npy").write_bytes(b"\x93NUMPY torn")
        raise KeyboardInterrupt  # the process is gone mid-generation

    monkeypatch.setattr(losscache.Builder, "commit", dies_mid_generation)
    monkeypatch.setattr(losscache.Builder, "abort", lambda builder: None)  # nothing runs
    with pytest.raises(KeyboardInterrupt):
        LossHistory.load(path, cache).save_cache(path, cache)
    monkeypatch.undo()
    assert len(list(cache.glob("gen-*"))) == 2  # the torn one beside the one in force
    history = LossHistory.load(path, cache)
    assert history.parsed_rows == 2000  # the old generation, the lines after it parsed
    same_history(history, LossHistory.load(path))
    assert history.save_cache(path, cache)
    assert len(list(cache.glob("gen-*"))) == 1  # the torn generation is gone
    assert LossHistory.load(path, cache).parsed_rows == 0


def test_a_cache_whose_columns_do_not_match_its_manifest_is_ignored(tmp_path):
    path, cache = tmp_path / ".loss.json", tmp_path / "loss-cache"
    long_run(path, 3000)
    LossHistory.load(path, cache).save_cache(path, cache)
    (column,) = cache.glob("gen-*/loss.npy")
    column.write_bytes(column.read_bytes()[:-800])  # 100 rows short
    history = LossHistory.load(path, cache)
    assert history.parsed_rows == 3000
    same_history(history, LossHistory.load(path))


def test_replays_over_the_cache_keep_the_newest_segment_and_the_audit_exact(tmp_path):
    path, cache = tmp_path / ".loss.json", tmp_path / "loss-cache"
    long_run(path, 3000, seg=1)
    LossHistory.load(path, cache).save_cache(path, cache)
    history = LossHistory.load(path, cache)
    audit = ResumeAudit(history, 2900, history.last_step)
    assert audit.expected == 100
    # A resumed trainer replays 2901..3000 with the same losses: verified, no drift.
    results = [audit.observe(s, 5.0 - s * 1e-4) for s in range(2901, 3001)]
    assert [r.status for r in results if r] == ["verified"]
    # A trainer started over from step 1 replaces cached rows one by one.
    for step in range(1, 51):
        history.add(step, 9.0, 0.1, 2e9, 2)
    assert len(history) == 3000
    assert history.get(50).seg == 2 and history.get(51).seg == 1
    assert history.query(1, 60, 100)["max"][:50] == [9.0] * 50
