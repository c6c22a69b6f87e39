"""The save report line of the trainer contract: what `parse_save_report` takes from a
line and what it refuses (any trainer may print such a line, or one that only looks like it)."""

from __future__ import annotations

import pytest

from trainwarden.supervisor.contract import SaveReport, parse_save_report, save_report_line

LINE = "checkpoint: step_000600.bin saved (scheduled, 1490.0 MB, stall 0.058 s, write 3.214 s)"


def test_the_reference_line_gives_its_name_stall_and_write():
    assert parse_save_report(LINE) == SaveReport("step_000600.bin", 0.058, 3.214)


def test_the_printed_line_reads_back_to_its_rounded_figures():
    line = save_report_line("step_000042.bin", "stop", 12.34, 0.0123456, 7.65432)
    assert parse_save_report(line) == SaveReport("step_000042.bin", 0.012, 7.654)


@pytest.mark.parametrize("ending", ["\r", "\n", "\r\n", "  ", " \r\n"])
def test_line_endings_and_trailing_blanks_do_not_matter(ending: str):
    assert parse_save_report(LINE + ending) == SaveReport("step_000600.bin", 0.058, 3.214)


@pytest.mark.parametrize(
    ("inside", "stall", "write"),
    [
        ("scheduled, 1490.0 MB, stall 0.058 s", 0.058, None),
        ("scheduled, write 3.214 s", None, 3.214),
        ("scheduled, 1490.0 MB", None, None),
        ("", None, None),
        ("write 2 s, stall 1 s", 1.0, 2.0),
        # Not figures: a unit other than s, a sign, an exponent, a word that merely ends so.
        ("stall 1 ms, write 2 min", None, None),
        ("stall -1 s, write +2 s", None, None),
        ("stall 1e3 s", None, None),
        ("mystall 1 s, overwrite 2 s", None, None),
        # Too long to be a float: it would read as inf, which is no time.
        (f"stall {'9' * 400} s, write 1.5 s", None, 1.5),
    ],
)
def test_missing_or_malformed_figures_are_none_and_the_name_stays(
    inside: str, stall: float | None, write: float | None
):
    assert parse_save_report(f"checkpoint: step_000001.bin saved ({inside})") == SaveReport(
        "step_000001.bin", stall, write
    )


@pytest.mark.parametrize(
    "line",
    [
        "checkpoint: 120, loss: 3.41, dt: 0.25",  # a step line of a trainer that starts so
        "checkpoint: step_000600.bin written (stall 0.1 s)",
        "checkpoint: step_000600.bin saved",
        "checkpoint: step_000600.bin saved (stall 0.1 s) and more",
        "checkpoint: step_000600.bin saved (stall 0.1 s",
        "checkpoint:step_000600.bin saved (stall 0.1 s)",
        " checkpoint: step_000600.bin saved (stall 0.1 s)",
        "Checkpoint: step_000600.bin saved (stall 0.1 s)",
        "checkpoints: step_000600.bin saved (stall 0.1 s)",
        "checkpoint:  saved (stall 0.1 s)",
        "checkpoint: ",
        "step: 600, loss: 3.2, dt: 0.25",
        "\x00\xff garbage (stall 1 s)",
        "",
    ],
)
def test_lines_that_are_not_reports_give_none(line: str):
    assert parse_save_report(line) is None
