"""The TUI's pure parts: sanitising, the braille chart, the model, message collapsing."""

from __future__ import annotations

import subprocess
import sys

from rich.text import Text

from tests.tui.fakes import FrozenClock, loss_history, status
from trainwarden.supervisor.journal_text import summary
from trainwarden.tui.chart import BRAILLE_BASE, render_chart
from trainwarden.tui.messages import HistoryReceived, StatusReceived, TopicPushed
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean, safe_text
from trainwarden.tui.widgets.events import ALARMING


def test_importing_the_tui_does_not_import_torch_or_daemon_internals():
    code = (
        "import sys, trainwarden.tui.app, trainwarden.tui.launch, trainwarden.tui.__main__; "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', "
        "'trainwarden.supervisor.shell', 'trainwarden.supervisor.serve', "
        "'trainwarden.supervisor.store', 'trainwarden.supervisor.inputs', "
        "'trainwarden.supervisor.core.decide', 'trainwarden.supervisor.core.state'))]; "
        "assert not bad, bad"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_clean_strips_escapes_and_controls_and_caps_length():
    assert clean("\x1b[31mred\x1b[0m \x1b]0;title\x07ok\x00\x07") == "red ok"
    assert clean("a\nb\tc\r\nd") == "a b c d"
    assert clean("\u202eevil") == "evil"  # no bidi override
    huge = clean("x" * 10_000_000, limit=50)
    assert len(huge) == 50 and huge.endswith("…")
    assert clean(None) == "None"


def test_markup_in_daemon_text_is_shown_literally():
    text = safe_text("[bold red]not markup[/] [link=http://x]y[/link]")
    assert isinstance(text, Text)
    assert text.plain == "[bold red]not markup[/] [link=http://x]y[/link]"
    assert not text.spans


def braille_cells(lines: list[Text]) -> list[tuple[int, int]]:
    return [
        (row, col)
        for row, line in enumerate(lines)
        for col, char in enumerate(line.plain)
        if BRAILLE_BASE < ord(char) <= BRAILLE_BASE + 0xFF
    ]


def test_chart_draws_a_falling_curve_from_top_left_to_bottom_right():
    history = {
        "step": list(range(100)),
        "mean": [10.0 - i * 0.05 for i in range(100)],
        "last_step": 99,
        "markers": [],
    }
    lines = render_chart(history, 40, 10, None)
    assert len(lines) == 10 and all(line.cell_len == 40 for line in lines)
    cells = braille_cells(lines[:8])
    top_left = min(cells, key=lambda rc: (rc[0], rc[1]))
    bottom = max(cells, key=lambda rc: (rc[0], rc[1]))
    assert top_left[0] == 0 and bottom[0] == 7 and bottom[1] > top_left[1]
    # Every plot column has a dot: the segments are joined.
    assert {col for _, col in cells} == set(range(8, 40))


def test_chart_shows_collapse_line_markers_and_nonfinite_buckets():
    history = loss_history(144)
    history["nonfinite"][100] = 3
    lines = render_chart(history, 80, 10, history["collapse_loss"])
    plain = [line.plain for line in lines]
    assert "╌" in "".join(plain[:8])
    assert "ln V 5.55" in plain[-1]
    markers = plain[-2]
    assert {"R", "C", "P"} <= set(markers)
    assert markers.index("R") <= markers.index("C") < markers.index("P")
    assert "!" in plain[0]


def test_chart_markers_sharing_a_cell_show_the_most_serious():
    history = loss_history(64)
    history["markers"] = [
        {"step": 6000, "kind": "restart"},
        {"step": 6000, "kind": "divergence"},
        {"step": 6000, "kind": "pivot"},
    ]
    lines = render_chart(history, 20, 6, None)
    assert lines[-2].plain.strip("└─ ") == "D"
    assert lines[-1].plain.strip() == "12,000"  # too narrow for both ends: the newest step


def test_chart_without_data_says_so():
    lines = render_chart({"step": [], "mean": []}, 40, 6)
    assert any("no steps logged yet" in line.plain for line in lines)


def test_model_advances_reported_durations_with_the_local_clock_only_while_connected():
    clock = FrozenClock()
    model = RunModel(clock=clock)
    model.set_connected({"run": "r"})
    model.apply_status({**status(), "state": "backoff", "detail": {"restart_in_s": 8.0}})
    clock.mono += 3
    assert model.restart_in_s() == 5.0
    assert model.trainer_uptime_s() == status()["trainer_uptime_s"] + 3
    assert model.checkpoint_age_s() == 45.0
    model.set_disconnected("gone", 1.0)
    assert model.trainer_uptime_s() == status()["trainer_uptime_s"]


def test_events_snapshot_is_a_list_and_pushes_are_single_records():
    model = RunModel(clock=FrozenClock())
    model.apply_topic("events", [{"kind": "a", "t": 1}, {"kind": "b", "t": 2}])
    model.apply_topic("events", {"kind": "c", "t": 3})
    model.apply_topic("events", "junk")
    assert [e["kind"] for e in model.events] == ["a", "b", "c"]


def test_latest_sample_per_arm_wins_by_step():
    model = RunModel(clock=FrozenClock())
    model.apply_topic(
        "samples",
        {
            "samples": [
                {"step": 20, "arm": "docs", "text": "new"},
                {"step": 10, "arm": "docs", "text": "old"},
                {"step": 10, "arm": "code", "text": "c"},
                "junk",
            ]
        },
    )
    latest = model.latest_samples()
    assert latest["docs"]["text"] == "new" and latest["code"]["text"] == "c"


def test_newest_frame_replaces_a_backlog_of_the_same_topic_only():
    old, new = TopicPushed("telemetry", {"step": 1}), TopicPushed("telemetry", {"step": 2})
    assert old.can_replace(new)
    assert not old.can_replace(TopicPushed("gpu", None))
    assert not TopicPushed("events", {}).can_replace(TopicPushed("events", {}))
    assert HistoryReceived({}).can_replace(HistoryReceived({}))
    assert StatusReceived({}).can_replace(StatusReceived({}))


def test_log_path_is_the_one_the_daemon_names_when_the_socket_is_local(tmp_path):
    from trainwarden.tui.source import local_log_path

    run = tmp_path / "run"
    (run / ".trainwarden").mkdir(parents=True)
    socket = run / ".trainwarden" / "control.sock"
    hello = {"run_dir": str(run), "log": str(run / "logs" / "train.out")}
    assert local_log_path(socket, hello) == run / "logs" / "train.out"  # [run] log honoured
    assert local_log_path(tmp_path / "forwarded.sock", hello) is None  # over SSH: not here
    assert local_log_path(socket, {"run_dir": str(run)}) is None  # a daemon that names none


def test_a_hint_record_is_summed_up_by_its_hint():
    hint = "no line matched parser step-line; sample: iter 1; set [telemetry] parser"
    record = {"kind": "parser_no_match", "ts": 1.0, "parser": "step-line", "hint": hint}
    assert summary(record) == hint
    assert {"parser_no_match", "checkpoint_unrecognised"} <= ALARMING
