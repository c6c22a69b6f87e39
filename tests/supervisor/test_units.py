"""systemd units: packaged templates, rendered units, names, and systemd's own verdict."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from trainwarden.supervisor.cli.units import (
    REQUIRED_KEYS,
    TEMPLATE_EXE,
    TEMPLATE_PATHS,
    Kind,
    escape_path,
    missing_keys,
    parse_unit,
    render_unit,
    template_unit,
    unit_install_path,
    unit_name,
)
from trainwarden.supervisor.core.exit_codes import RESTART_PREVENTED, ExitCode
from trainwarden.supervisor.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
SYSTEMD_ESCAPE = shutil.which("systemd-escape")
needs_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (apt install systemd)"
)
needs_escape = pytest.mark.skipif(
    SYSTEMD_ESCAPE is None, reason="systemd-escape is not installed (apt install systemd)"
)
KINDS: tuple[Kind, ...] = ("system", "user")
ME = pwd.getpwuid(os.getuid()).pw_name


def make_executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def assert_systemd_accepts(unit: Path, kind: Kind, tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    runtime_dir = tmp_path / "xdg-runtime"
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    command = [SYSTEMD_ANALYZE, *(["--user"] if kind == "user" else []), "verify", str(unit)]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir), "SYSTEMD_PAGER": "cat"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Unknown keys and bad values are only warnings; each names the unit file.
    assert unit.name not in output, output


def test_packaged_templates_are_what_units_py_generates() -> None:
    for kind in KINDS:
        packaged = (REPO / TEMPLATE_PATHS[kind]).read_text(encoding="utf-8")
        assert packaged == template_unit(kind), (
            f"{TEMPLATE_PATHS[kind]} differs from supervisor/cli/units.py: edit units.py and "
            "run `python -m trainwarden.supervisor.cli.units`"
        )


@pytest.mark.parametrize("kind", KINDS)
def test_templates_keep_required_keys(kind: Kind) -> None:
    assert missing_keys(template_unit(kind)) == []


@pytest.mark.parametrize(("kind", "user"), [("system", None), ("system", ME), ("user", None)])
def test_rendered_units_keep_required_keys(kind: Kind, user: str | None, tmp_path: Path) -> None:
    text = render_unit(kind, tmp_path / "bin" / "trainwarden", tmp_path / "run", user)

    assert missing_keys(text) == []


@pytest.mark.parametrize("key", list(REQUIRED_KEYS))
def test_missing_keys_notices_each_lost_or_changed_key(key: str) -> None:
    lines = template_unit("system").splitlines()
    without = "\n".join(line for line in lines if not line.startswith(f"{key}="))
    changed = "\n".join(
        f"{key}=something-else" if line.startswith(f"{key}=") else line for line in lines
    )

    assert any(item.split("=")[0] == key for item in missing_keys(without))
    if REQUIRED_KEYS[key] is not None:
        assert missing_keys(changed) == [f"{key}={REQUIRED_KEYS[key]}"]


def test_template_details() -> None:
    system = parse_unit(template_unit("system"))
    user = parse_unit(template_unit("user"))

    assert system["Unit"]["After"] == "network-online.target nvidia-persistenced.service"
    assert "Wants" not in system["Unit"] and "Requires" not in system["Unit"]
    assert "After" not in user["Unit"]
    for unit in (system, user):
        assert unit["Unit"]["StartLimitIntervalSec"] == "0"
        assert unit["Service"]["ExecStart"] == f"{TEMPLATE_EXE} daemon %f"
        assert unit["Service"]["ReadWritePaths"].split()[0] == "%f"
        assert unit["Service"]["WorkingDirectory"] == "%f"
        assert unit["Service"]["RestartSec"] == "30"
        assert int(unit["Service"]["TimeoutStopSec"]) >= 300
        assert "PrivateDevices" not in unit["Service"]
        assert "DevicePolicy" not in unit["Service"]
        assert "MemoryDenyWriteExecute" not in unit["Service"]
    assert "User" not in system["Service"] and "#User=" in template_unit("system")
    assert "User" not in user["Service"]
    assert system["Install"]["WantedBy"] == "multi-user.target"
    assert user["Install"]["WantedBy"] == "default.target"


def restart_prevented(text: str) -> set[int]:
    return {int(word) for word in parse_unit(text)["Service"]["RestartPreventExitStatus"].split()}


@pytest.mark.parametrize("kind", KINDS)
def test_restart_prevent_exit_status_is_the_exit_code_tables(kind: Kind, tmp_path: Path) -> None:
    rendered = render_unit(kind, make_executable(tmp_path / "tw"), tmp_path / "run")
    for text in (template_unit(kind), (REPO / TEMPLATE_PATHS[kind]).read_text(), rendered):
        prevented = restart_prevented(text)
        assert prevented == {int(code) for code in RESTART_PREVENTED}
        # A halted daemon the operator shut down stays down; a crash is retried.
        assert {ExitCode.CONFIG, ExitCode.HALTED} <= prevented
        assert not prevented & {ExitCode.FINISHED, ExitCode.STOPPED, ExitCode.ERROR}
        assert parse_unit(text)["Service"]["Restart"] == "on-failure"


@needs_analyze
@pytest.mark.parametrize("kind", KINDS)
def test_systemd_accepts_the_packaged_templates(kind: Kind, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "gpt2-124m"
    # ExecStart must name an existing program; putting it under %f also checks that
    # %f turns the instance name back into the run directory.
    make_executable(run_dir / "trainwarden")
    text = (REPO / TEMPLATE_PATHS[kind]).read_text(encoding="utf-8")
    assert TEMPLATE_EXE in text
    unit = tmp_path / "units" / f"trainwarden@{escape_path(run_dir)}.service"
    unit.parent.mkdir()
    unit.write_text(text.replace(TEMPLATE_EXE, "%f/trainwarden"))

    assert_systemd_accepts(unit, kind, tmp_path)


@needs_analyze
@pytest.mark.parametrize(("kind", "user"), [("system", None), ("system", ME), ("user", None)])
def test_systemd_accepts_rendered_units(kind: Kind, user: str | None, tmp_path: Path) -> None:
    # Spaces, % and $ in both paths: the executable is found only if quoting is right.
    exe = make_executable(tmp_path / "tw venv 100%" / "bin$HOME" / "trainwarden")
    run_dir = tmp_path / "runs" / "gpt2 124m 50% $HOME"
    run_dir.mkdir(parents=True)
    unit = tmp_path / "units" / unit_name(run_dir)
    unit.parent.mkdir()
    unit.write_text(render_unit(kind, exe, run_dir, user))

    assert_systemd_accepts(unit, kind, tmp_path)


@needs_analyze
def test_systemd_verify_check_can_fail(tmp_path: Path) -> None:
    unit = tmp_path / unit_name(tmp_path / "run")
    unit.write_text(template_unit("system").replace("%f", str(tmp_path / "run")))

    with pytest.raises(AssertionError, match="not executable"):
        assert_systemd_accepts(unit, "system", tmp_path)


def test_rendered_unit_has_absolute_paths(tmp_path: Path) -> None:
    exe, run_dir = Path("/opt/trainwarden/bin/trainwarden"), Path("/home/alice/runs/gpt2")

    text = render_unit("system", exe, run_dir, ME)
    service = parse_unit(text)["Service"]

    assert service["ExecStart"] == "/opt/trainwarden/bin/trainwarden daemon /home/alice/runs/gpt2"
    assert service["WorkingDirectory"] == "/home/alice/runs/gpt2"
    home = pwd.getpwnam(ME).pw_dir
    assert service["ReadWritePaths"].split() == [
        "/home/alice/runs/gpt2",
        f"-{home}/.cache",
        f"-{home}/.triton",
    ]
    assert service["User"] == ME
    assert parse_unit(text)["Unit"]["Description"].endswith("/home/alice/runs/gpt2")
    setting_lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert not any("%f" in line for line in setting_lines)


def test_rendered_user_unit_keeps_home_caches_as_specifiers(tmp_path: Path) -> None:
    service = parse_unit(render_unit("user", Path("/x/tw"), Path("/r")))["Service"]

    assert service["ReadWritePaths"] == "/r -%h/.cache -%h/.triton"
    assert "User" not in service


def test_rendered_unit_normalises_paths() -> None:
    service = parse_unit(render_unit("user", Path("/x//bin/./tw"), Path("/runs/a/")))["Service"]

    assert service["ExecStart"] == "/x/bin/tw daemon /runs/a"


def test_timeout_stop_grows_with_the_trainers_stop_timeout() -> None:
    def timeout(stop_s: float | None) -> int:
        text = render_unit("user", Path("/x/tw"), Path("/r"), trainer_stop_timeout_s=stop_s)
        return int(parse_unit(text)["Service"]["TimeoutStopSec"])

    assert timeout(None) == 300
    assert timeout(120) == 300
    assert timeout(600.5) == 661


@pytest.mark.parametrize(
    ("kind", "exe", "run_dir", "user", "message"),
    [
        ("system", "bin/trainwarden", "/r", None, "must be absolute"),
        ("system", "/x/tw", "runs/r", None, "must be absolute"),
        ("system", "/x/tw", '/runs/"quoted"', None, "cannot carry"),
        ("system", "/x/tw", "/runs/back\\slash", None, "cannot carry"),
        ("system", "/x/tw", "/runs/new\nline", None, "cannot carry"),
        ("user", "/x/tw", "/r", "alice", "system units only"),
        ("system", "/x/tw", "/r", "no-such-user-tw", "no such user"),
    ],
)
def test_render_unit_refuses_what_it_cannot_express(
    kind: Kind, exe: str, run_dir: str, user: str | None, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        render_unit(kind, Path(exe), Path(run_dir), user)


ESCAPE_CASES = [
    "/home/me/runs/gpt2-124m",
    "/tmp/a b/ü",
    "/.hidden/x",
    "/srv//double/",
    "/a/./b",
    "/",
    "/x/-y/z_1:2.3",
    "/runs/50%/$HOME/~me@host/a=b,c+d",
    "/runs/back\\slash",
]


def test_escape_path_examples() -> None:
    assert escape_path("/home/me/runs/gpt2-124m") == "home-me-runs-gpt2\\x2d124m"
    assert escape_path("/") == "-"
    assert escape_path("/.hidden/x") == "\\x2ehidden-x"
    assert escape_path(Path("/tmp/a b/ü")) == "tmp-a\\x20b-\\xc3\\xbc"
    with pytest.raises(ValueError, match="normalized"):
        escape_path("/a/../b")


@needs_escape
@pytest.mark.parametrize("path", ESCAPE_CASES)
def test_escape_path_matches_systemd_escape(path: str) -> None:
    assert SYSTEMD_ESCAPE is not None
    expected = subprocess.run(
        [SYSTEMD_ESCAPE, "--path", "--", path], capture_output=True, text=True, check=True
    ).stdout.strip()

    assert escape_path(path) == expected
    assert unit_name(path) == f"trainwarden-{expected}.service"


@needs_escape
@pytest.mark.parametrize("path", ESCAPE_CASES)
def test_escaped_path_unescapes_to_the_run_directory(path: str) -> None:
    assert SYSTEMD_ESCAPE is not None
    back = subprocess.run(
        [SYSTEMD_ESCAPE, "--unescape", "--path", "--", escape_path(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    assert back == os.path.normpath(path).replace("//", "/")


def test_unit_name_too_long_for_systemd() -> None:
    with pytest.raises(UsageError, match="too long"):
        unit_name("/" + "x" * 240)


def test_unit_install_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    name = unit_name("/home/me/run")

    assert unit_install_path("system", name) == Path("/etc/systemd/system") / name
    assert unit_install_path("user", name) == tmp_path / ".config/systemd/user" / name


SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.mark.parametrize("scope", ["--user", "--system"])
def test_install_unit_warns_when_the_trainer_is_a_bare_program_name(
    scope: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """systemd starts the daemon with its own PATH, not the shell's: a bare `python` is
    whatever that PATH holds, not this venv's interpreter. Said in one line, exit 0."""
    import sys

    from tests.support.runs import make_run
    from trainwarden.supervisor.cli.main import main
    from trainwarden.supervisor.cli.units import SYSTEMD_PATH

    run_dir = make_run(tmp_path / "run", ["python", "train.py"])
    assert main(["install-unit", str(run_dir), scope, "--dry-run"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("# trainwarden: supervises")  # the unit, on stdout
    kind = scope.removeprefix("--")
    if kind == "system":
        assert SYSTEMD_PATH["system"] == SYSTEM_PATH
    found = shutil.which("python", path=SYSTEMD_PATH[kind]) or "nothing"
    venv_python = str(Path(sys.executable).parent / "python")
    (line,) = out.err.splitlines()
    assert line.startswith("trainwarden install-unit: warning: [trainer] command runs `python`")
    assert (
        f"the daemon looks it up on its own PATH ({SYSTEMD_PATH[kind]}) and finds {found}," in line
    )
    assert f"not this environment's {venv_python}" in line
    assert f'write the absolute path in [trainer] command: "{venv_python}"' in line

    absolute = make_run(tmp_path / "absolute", [venv_python, "train.py"])
    assert main(["install-unit", str(absolute), scope, "--dry-run"]) == 0
    assert capsys.readouterr().err == ""
