"""The package as a user installs it: the wheel built from this checkout, installed with pip
into a fresh venv (no torch, no system site-packages), next to supervisord's `supervisor`.

One venv serves the module (its dependencies come from the package registry; pip's cache
makes the install quick after the first time). Every command runs from a scratch folder
with a clean environment, so nothing is imported from the checkout by accident.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import belongs_to_run, journal, kill_quietly, pid_alive, trainer_pid, wait_for

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("supervisor", "tui", "plugins", "trainer", "integrations")
SCRIPTED = ROOT / "tests" / "scripted_trainer.py"
NOT_COPIED = {".git", ".venv", "build", "dist", "__pycache__", ".hypothesis", "runs", "out"}
INSTALL_TORCH = "pip install 'trainwarden[trainer]'"


def _not_copied(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n in NOT_COPIED or n.endswith((".egg-info", "_cache"))}


@dataclass(frozen=True)
class Wheel:
    path: Path
    names: list[str]
    dist_info: str

    def read(self, name: str) -> str:
        with zipfile.ZipFile(self.path) as zf:
            return zf.read(f"{self.dist_info}/{name}").decode()


@dataclass(frozen=True)
class Venv:
    root: Path
    work: Path
    """The folder commands run in: nothing importable lies there."""

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "TRAINWARDEN")) and k != "VIRTUAL_ENV"
        }
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.root)
        return env

    def run(self, *argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A program of the venv's bin/ (or any path), run in `work` with the venv's env."""
        program = str(argv[0])
        if "/" not in program:
            program = str(self.root / "bin" / program)
        return subprocess.run(
            [program, *map(str, argv[1:])],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.work,
            env=self.env,
            stdin=subprocess.DEVNULL,
        )

    def python_c(self, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(self.python, "-c", code, timeout=timeout)

    def pip(self, *args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
        done = self.run(self.python, "-m", "pip", *args, timeout=timeout)
        assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done


def said(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    """The wheel pip builds from a copy of this checkout (the checkout gets no build/)."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=_not_copied)
    out = base / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=420,
        cwd=base,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )
    assert done.returncode == 0, f"pip wheel failed: {said(done)}"
    (path,) = out.glob("trainwarden-*.whl")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    (dist_info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    return Wheel(path, names, dist_info)


@pytest.fixture(scope="module")
def venv(wheel: Wheel, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv (no system site-packages) with the wheel and its dependencies."""
    base = tmp_path_factory.mktemp("venv")
    work = base / "work"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "venv", str(base / "venv")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=base,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )
    assert done.returncode == 0, f"python -m venv failed: {said(done)}"
    env = Venv(base / "venv", work)
    # Bytecode is compiled on first import, for what the tests import (as the README's
    # install does): compiling every dependency at install costs this suite ~10 s.
    env.pip("install", "--no-compile", "--disable-pip-version-check", str(wheel.path))
    return env


# ----------------------------------------------------------------------------- the wheel


def test_the_wheel_installs_one_top_level_name(wheel: Wheel):
    tops = sorted({name.split("/")[0] for name in wheel.names})
    assert tops == ["trainwarden", wheel.dist_info], (
        f"the wheel installs top-level names other than trainwarden: {tops}"
    )
    if f"{wheel.dist_info}/top_level.txt" in wheel.names:
        assert wheel.read("top_level.txt").split() == ["trainwarden"], "top_level.txt disagrees"


def test_the_wheel_holds_every_module_of_the_source_folders_and_its_data(wheel: Wheel):
    names = set(wheel.names)
    missing = [
        f"trainwarden/{path.relative_to(ROOT)}"
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".tcss")
        and "__pycache__" not in path.parts
        and f"trainwarden/{path.relative_to(ROOT)}" not in names
    ]
    assert not missing, f"source files left out of the wheel (a package not listed?): {missing}"
    assert "trainwarden/__init__.py" in names
    assert "trainwarden/py.typed" in names, "py.typed is missing: type checkers ignore the package"
    assert "trainwarden/tui/trainwarden.tcss" in names, "the TUI's stylesheet is missing"


def test_the_entry_points_all_point_into_trainwarden(wheel: Wheel):
    parser = configparser.ConfigParser()
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(wheel.read("entry_points.txt"))
    scripts = dict(parser["console_scripts"])
    assert sorted(scripts) == ["trainwarden", "trainwarden-trainer"], f"console scripts: {scripts}"
    for group, expected in (("trainwarden.formats", "torch-pt"), ("trainwarden.parsers", "jsonl")):
        assert group in parser, f"entry point group {group} is missing"
        assert expected in parser[group], f"{expected} is not registered in {group}"
    for group in ("console_scripts", "trainwarden.formats", "trainwarden.parsers"):
        for name, target in parser[group].items():
            module = target.split(":")[0].strip()
            assert module.startswith("trainwarden."), f"{group} {name} = {target}: outside"
            path = module.replace(".", "/")
            assert f"{path}.py" in wheel.names or f"{path}/__init__.py" in wheel.names, (
                f"{group} {name} = {target}: no such module in the wheel"
            )


def test_torch_is_only_the_trainer_extra(wheel: Wheel):
    metadata = wheel.read("METADATA").splitlines()
    torch = [line for line in metadata if line.startswith("Requires-Dist: torch")]
    assert torch, "torch is not declared at all (the trainer extra must name it)"
    assert all('extra == "trainer"' in line for line in torch), (
        f"torch is required outside the trainer extra: {torch}"
    )
    assert "Provides-Extra: trainer" in metadata


# ----------------------------------------------------------------------------- without torch


def test_the_fresh_venv_has_no_torch_and_no_bare_folder_names(venv: Venv):
    done = venv.python_c("import torch")
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, (
        f"torch is importable in the fresh venv: {said(done)}"
    )
    for bare in FOLDERS:
        done = venv.python_c(f"import {bare}")
        assert "ModuleNotFoundError" in done.stderr, f"`import {bare}` works: {said(done)}"
    done = venv.python_c("import trainwarden.supervisor as s; print(s.__file__)")
    assert done.returncode == 0, said(done)
    assert done.stdout.strip().startswith(str(venv.root)), (
        f"trainwarden came from outside the venv: {done.stdout}"
    )


def test_help_works_without_torch(venv: Venv):
    done = venv.run("trainwarden", "--help")
    assert done.returncode == 0 and "daemon" in done.stdout, f"trainwarden --help: {said(done)}"
    done = venv.run("trainwarden", "tui", "--help")
    assert done.returncode == 0 and "usage" in done.stdout, f"trainwarden tui --help: {said(done)}"


TUI_ATTACH = """\
import asyncio, json, sys
from pathlib import Path

from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.source import DaemonSource

socket, log, deadline_s = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])


def screen(app):
    strips = app.screen._compositor.render_strips()
    return "\\n".join("".join(segment.text for segment in strip) for strip in strips)


async def main():
    app = TrainwardenApp(DaemonSource(socket, log), read_only=True)
    async with app.run_test(size=(120, 36)) as pilot:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        while not (
            app.model.phase == "running"
            and (app.model.telemetry.value or {}).get("step")
            and (app.model.checkpoints or {}).get("checkpoints")
        ):
            if loop.time() > deadline:
                sys.exit("the TUI never showed a running run; screen:\\n" + screen(app))
            await pilot.pause(0.1)
        await pilot.pause(0.5)
        steps = [c["step"] for c in app.model.checkpoints["checkpoints"]]
        print(json.dumps({
            "phase": app.model.phase,
            "run": app.model.run_name,
            "step": app.model.telemetry.value["step"],
            "checkpoints": steps,
            "screen": screen(app),
        }))


asyncio.run(main())
"""


@dataclass
class VenvDaemon:
    run_dir: Path
    proc: subprocess.Popen[bytes]

    def cleanup(self) -> None:
        pids = {trainer_pid(self.run_dir)}
        with contextlib.suppress(OSError):
            pids.update(
                r["pid"] for r in journal(self.run_dir) if r.get("kind") == "trainer_started"
            )
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in pids:
            if belongs_to_run(pid, self.run_dir):
                kill_quietly(pid)


@pytest.fixture
def venv_daemon(venv: Venv, tmp_path: Path) -> Iterator[VenvDaemon]:
    """`trainwarden daemon RUN` of the venv, as systemd runs it, on a scripted trainer."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "trainwarden.toml").write_text(
        textwrap.dedent(
            f"""\
            [run]
            name = "venv-run"
            [trainer]
            command = [{json.dumps(str(venv.python))}, {json.dumps(str(SCRIPTED))},
                       "--steps", "100000", "--save-every", "5", "--dt", "0.05"]
            stop_timeout_s = 10.0
            [restart]
            backoff_initial_s = 0.0
            backoff_max_s = 0.5
            [telemetry]
            tokens_per_step = 512
            """
        )
    )
    with open(tmp_path / "daemon.stderr", "wb") as err:
        proc = subprocess.Popen(
            [venv.root / "bin" / "trainwarden", "daemon", run_dir],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            cwd=venv.work,
            env=venv.env,
            start_new_session=True,
        )
    daemon = VenvDaemon(run_dir, proc)
    try:
        yield daemon
    finally:
        daemon.cleanup()


def test_the_daemon_status_and_tui_work_without_torch(venv: Venv, venv_daemon: VenvDaemon):
    run_dir = venv_daemon.run_dir

    def daemon_log() -> str:
        return (run_dir.parent / "daemon.stderr").read_text(errors="replace")[-3000:]

    def status() -> dict[str, Any] | None:
        assert venv_daemon.proc.poll() is None, f"the daemon exited:\n{daemon_log()}"
        done = venv.run("trainwarden", "status", "--json", run_dir, timeout=60)
        return json.loads(done.stdout) if done.returncode == 0 else None

    running = wait_for(
        lambda: (s := status()) and s["state"] == "running" and (s.get("step") or 0) >= 10 and s,
        90,
        0.3,
        "the venv's daemon to supervise a running trainer past step 10",
    )
    assert running["run"] == "venv-run" and pid_alive(running["trainer_pid"])

    ckpts = venv.run("trainwarden", "checkpoints", "--json", run_dir)
    assert ckpts.returncode == 0, f"trainwarden checkpoints: {said(ckpts)}"
    counted = [c["step"] for c in json.loads(ckpts.stdout)["checkpoints"] if c["verified"]]
    assert counted, f"no checkpoint was counted: {ckpts.stdout}"
    assert (run_dir / "checkpoints" / f"step_{counted[-1]:06d}.bin").exists()

    text = venv.run("trainwarden", "status", run_dir)
    assert text.returncode == 0 and "running" in text.stdout.lower(), (
        f"trainwarden status (text) does not say running: {said(text)}"
    )

    script = run_dir.parent / "tui_attach.py"
    script.write_text(TUI_ATTACH)
    socket = run_dir / ".trainwarden" / "control.sock"
    tui = venv.run(venv.python, script, socket, run_dir / "training.log", "60", timeout=150)
    assert tui.returncode == 0, f"the TUI did not attach headless: {said(tui)}"
    shown = json.loads(tui.stdout.strip().splitlines()[-1])
    assert shown["phase"] == "running" and shown["run"] == "venv-run", shown
    assert shown["step"] >= running["step"], "the TUI shows an older step than status did"
    assert "RUNNING" in shown["screen"] and "venv-run" in shown["screen"], shown["screen"]
    # A checkpoint every 0.25 s: the screen may be one refresh behind the model's newest.
    recent = sorted(shown["checkpoints"])[-2:]
    assert any(f"{s:,}" in shown["screen"] for s in recent), "the newest checkpoint is not shown"

    pid = running["trainer_pid"]
    done = venv.run("trainwarden", "shutdown", run_dir, timeout=60)
    assert done.returncode == 0 and "daemon is exiting" in done.stdout, f"shutdown: {said(done)}"
    assert venv_daemon.proc.wait(30) == 0, f"the daemon did not exit 0:\n{daemon_log()}"
    wait_for(lambda: not pid_alive(pid), 10, what="the trainer to exit")
    assert "daemon_exit" in [r["kind"] for r in journal(run_dir)]


def test_a_torch_pt_config_without_torch_names_the_extra(venv: Venv, tmp_path: Path):
    run_dir = tmp_path / "torch-run"
    run_dir.mkdir()
    (run_dir / "trainwarden.toml").write_text(
        f'[trainer]\ncommand = [{json.dumps(str(venv.python))}, "-c", "pass"]\n'
        '[checkpoints]\nformat = "torch-pt"\n'
    )
    done = venv.run("trainwarden", "daemon", run_dir, timeout=60)
    assert done.returncode == 2, f"expected exit 2 (config error): {said(done)}"
    assert "Traceback" not in done.stderr, f"a traceback instead of a message: {said(done)}"
    assert len(done.stderr.splitlines()) == 1, f"the error is not one line: {said(done)}"
    assert INSTALL_TORCH in done.stderr, f"the error does not name the extra: {said(done)}"
    assert not (run_dir / ".trainwarden" / "journal.jsonl").exists(), "the daemon started"


# ----------------------------------------------------------------------------- supervisord


def test_supervisord_installs_beside_trainwarden_and_leaves_it_whole(venv: Venv):
    venv.pip("install", "supervisor")
    try:
        done = venv.python_c(
            "import supervisor, trainwarden.supervisor; "
            "print(supervisor.__file__); print(trainwarden.supervisor.__file__)"
        )
        assert done.returncode == 0, f"importing both failed: {said(done)}"
        theirs, ours = map(Path, done.stdout.split())
        site = theirs.parent.parent
        assert theirs == site / "supervisor" / "__init__.py", f"supervisord's module: {theirs}"
        assert ours == site / "trainwarden" / "supervisor" / "__init__.py", f"ours: {ours}"

        ctl = venv.run("supervisorctl", "--help")
        assert ctl.returncode == 0 and "supervisorctl" in ctl.stdout, f"supervisorctl: {said(ctl)}"
        version = venv.run("supervisord", "--version")
        assert version.returncode == 0 and version.stdout.strip(), f"supervisord: {said(version)}"
        done = venv.run("trainwarden", "--help")
        assert done.returncode == 0, f"trainwarden --help beside supervisord: {said(done)}"
    finally:
        venv.pip("uninstall", "-y", "supervisor")

    done = venv.python_c("import supervisor")
    assert "ModuleNotFoundError" in done.stderr, f"supervisor is still importable: {said(done)}"
    done = venv.run("trainwarden", "--help")
    assert done.returncode == 0, f"uninstalling supervisord broke trainwarden: {said(done)}"
    # Every file pip installed for trainwarden is still there, and the daemon imports.
    done = venv.python_c(
        "import importlib.metadata as m; "
        "gone = [str(f) for f in m.files('trainwarden') if not f.locate().exists()]; "
        "print(gone); import trainwarden.supervisor.shell.daemon, trainwarden.tui.app"
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", (
        f"uninstalling supervisord removed trainwarden files: {said(done)}"
    )
