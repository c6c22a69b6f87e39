"""Loss spikes as the TUI shows them: the incident caption, the events panel's lines, the
chart's spike and skip markers and its legend (records shaped as the daemon writes them)."""

from __future__ import annotations

from typing import Any

from tests.tui.test_caption import rec, spawn
from trainwarden.supervisor.journal_text import summary
from trainwarden.tui.chart import has_spike_markers, render_chart
from trainwarden.tui.widgets.caption import caption_text

SPIKE = rec(
    20,
    "spike",
    first_step=100,
    step=102,
    peak=15.0,
    ema=4.91,
    threshold=9.82,
    factor=2.0,
    patience=3,
    detected_after=3,
)
ROLLBACK = rec(
    20.2,
    "rollback",
    spike_step=100,
    checkpoint="step_000080.bin",
    step=80,
    steps_before=20,
    window=[81, 113],
    skip_data=[[81, 113]],
    lr_scale=0.5,
    supported={"skip_data": True, "lr_scale": True},
    quarantined=[90, 100],
    rollbacks=1,
    max_rollbacks=3,
)
INCIDENT = [
    rec(19.9, "signal", signal="SIGKILL", pid=11, reason="loss spike: above 9.82"),
    SPIKE,
    rec(20.1, "quarantine", step=90, name="step_000090.bin", cause="rollback", cause_step=100),
    ROLLBACK,
    rec(20.3, "trainer_killed", pid=11, returncode=-9, last_step=103, cause="spike"),
    spawn(20.4, 2, 80, rollback_from=100, skip_data=[[81, 113]], lr_scale=0.5),
]


def test_the_caption_says_what_spiked_and_how_the_daemon_rolled_back():
    found = caption_text(INCIDENT)
    assert found is not None
    _, text = found
    # What the daemon did first (an 80-column terminal shows that much), the peak last.
    assert text == (
        "loss spike at step 100 (2.0x average); daemon rolled back to step 80, skipping"
        " the data of steps 81-112 and restarted it; peak 15.0000"
    )


def test_the_caption_of_a_plain_rollback_says_no_data_was_skipped():
    plain = {**ROLLBACK, "window": None, "skip_data": []}
    found = caption_text([SPIKE, plain])
    assert found is not None and "rolled back to step 80, no data skipped;" in found[1]


def test_the_caption_of_a_spike_that_halts_the_run_says_so():
    halt = rec(21, "halt", state="diverged", cause="spike", reason="the loss spiked again")
    found = caption_text([{**SPIKE, "halts": True}, halt])
    assert found is not None and "daemon halted the run (diverged)" in found[1]


def test_the_events_panel_heads_spike_and_rollback_lines_with_what_matters():
    assert summary(SPIKE).startswith("loss 15.0000 from step 100 to 102, above 9.8200")
    assert summary(ROLLBACK).startswith("to step 80, skip 81..113, lr x0.5")


def history_with(markers: list[dict[str, Any]]) -> dict[str, Any]:
    steps = list(range(0, 200, 2))
    return {
        "step": steps,
        "mean": [5.0 - s * 0.001 for s in steps],
        "last_step": steps[-1],
        "markers": markers,
    }


def test_the_chart_marks_the_spike_and_where_the_data_skip_starts():
    history = history_with([{"step": 100, "kind": "spike"}, {"step": 20, "kind": "skip"}])
    markers = render_chart(history, 60, 10, None)[-2].plain
    assert "S" in markers and "»" in markers
    assert markers.index("»") < markers.index("S")
    assert has_spike_markers(history) and not has_spike_markers(history_with([]))
