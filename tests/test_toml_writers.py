"""Every TOML the project writes reads back as written: `trainwarden init`'s config, a
branch's config, the `[checkpoints]` setting a hint suggests, the command a renamed-module
error suggests, and the test suite's run factory. Each is given strings that need every kind
of escape and must come back from tomllib equal."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from tests.support import make_run
from trainwarden.supervisor.checkpoint_hints import step_pattern, unrecognised_hint
from trainwarden.supervisor.cli.branch import render_toml
from trainwarden.supervisor.cli.init import write_config
from trainwarden.supervisor.config import CONFIG_NAME, load_config
from trainwarden.supervisor.errors import ConfigError

AWKWARD = 'a "quote", a back\\slash, a new\nline, a\ttab, \x01, \x7f, ünïcødé'
"""A string that needs every escape TOML has (a folder name may hold all of it)."""


def test_init_writes_its_strings_as_toml_reads_them(tmp_path: Path, monkeypatch):
    run_dir = tmp_path / AWKWARD
    python = str(tmp_path / f"bin {AWKWARD}" / "python")
    monkeypatch.setattr(sys, "executable", python)
    path = write_config(run_dir, preset=AWKWARD, device=AWKWARD, extra_args=[AWKWARD, "--x"])
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    assert raw["run"]["name"] == AWKWARD
    command = raw["trainer"]["command"]
    assert command[0] == python
    assert command[command.index("--preset") + 1] == AWKWARD
    assert command[command.index("--device") + 1] == AWKWARD
    assert command[-2:] == [AWKWARD, "--x"]


def test_init_writes_the_same_template_as_before(tmp_path: Path):
    """Only the escaping changed: the comments and layout of the template stay as they were."""
    text = write_config(tmp_path / "run", extra_args=["--compile"]).read_text(encoding="utf-8")
    python = tomli_w.dumps({"v": sys.executable})[4:-1]
    assert (
        f'command = [{python}, "-m", "trainwarden.trainer", "--run-dir", ".", "--preset", "tiny",'
        ' "--steps", "2000", "--save-every", "100", "--device", "auto", "--compile"]\n'
    ) in text
    assert text.startswith(
        "# trainwarden run configuration (reference: docs/configuration.md).\n"
        '[run]\nname = "run"\nlog = "training.log"\n\n[trainer]\n'
        "# The trainer's argv; it runs with the run directory as its working directory.\n"
    )


def test_a_branch_config_reads_back_as_the_tables_it_was_given():
    raw = {
        "run": {"name": AWKWARD, AWKWARD: True},
        "trainer": {"command": [AWKWARD, "-m", "x"], "env": {AWKWARD: AWKWARD, "N": "1"}},
        "checkpoints": {"options": {"pattern": AWKWARD, "nested": {"k": [1, 2.5]}}},
        "restart": {"stall_timeout_s": 300, "backoff_max_s": float("inf")},
    }
    assert tomllib.loads(render_toml(raw)) == raw


def hint_setting(hint: str) -> str:
    """The TOML a hint tells the user to set (its text after the last `set [checkpoints] `)."""
    return hint.rsplit("set [checkpoints] ", 1)[1]


def test_a_hint_for_a_file_saved_in_place_names_it_as_toml_reads_it():
    name = f"{AWKWARD}.pt"
    setting = hint_setting(unrecognised_hint(name, False, "torch-pt"))
    fixed, step_key = setting.split(" and ")
    assert tomllib.loads(fixed) == {"fixed": name}
    assert tomllib.loads(step_key) == {"step_key": "iter_num"}


@pytest.mark.parametrize("suffix", [".pt", ".ckpt"])
def test_a_hint_for_a_step_in_the_name_gives_its_pattern_as_toml_reads_it(suffix: str):
    name = f"{AWKWARD}_600{suffix}"
    setting = hint_setting(unrecognised_hint(name, False, "torch-pt"))
    fmt, _, options = setting.rpartition(" and ")
    assert fmt in ("", 'format = "torch-pt"')
    assert tomllib.loads(options) == {"options": {"pattern": step_pattern(name)}}


def test_the_renamed_module_error_suggests_a_command_toml_reads_back(tmp_path: Path):
    command = ["python", "-m", "trainer", AWKWARD]
    (tmp_path / CONFIG_NAME).write_text(tomli_w.dumps({"trainer": {"command": command}}))
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    suggested = str(caught.value).split("write ", 1)[1].rsplit(" (or run", 1)[0]
    assert tomllib.loads(suggested) == {"command": ["python", "-m", "trainwarden.trainer", AWKWARD]}


def test_the_run_factory_writes_its_tables_as_toml_reads_them(tmp_path: Path):
    tables = {
        "run": {"name": AWKWARD},
        "checkpoints": {"options": {AWKWARD: AWKWARD, "n": [1, 2]}, "pinned": (10,)},
    }
    run_dir = make_run(tmp_path / "run", [AWKWARD, "-c", "pass"], **tables)
    raw = tomllib.loads((run_dir / CONFIG_NAME).read_text(encoding="utf-8"))
    assert raw == {
        "trainer": {"command": [AWKWARD, "-c", "pass"]},
        "run": {"name": AWKWARD},
        "checkpoints": {"options": {AWKWARD: AWKWARD, "n": [1, 2]}, "pinned": [10]},
    }
