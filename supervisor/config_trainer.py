"""The trainer's command checked: that it runs `-m` no module since renamed (load_config's
check unless told to skip what only a start needs), and, when a daemon starts, that the
trainer's working directory is a folder and its program (and the script an interpreter
runs) can be executed there, here and now.

`init` and `install-unit` skip the second: they may write a config for a trainer that is
installed later, or on another machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

from trainwarden.supervisor.config_checks import invalid
from trainwarden.supervisor.config_schema import Config
from trainwarden.supervisor.config_toml import toml_value
from trainwarden.supervisor.errors import ConfigError

RENAMED_MODULES = {"trainer": "trainwarden.trainer"}
"""Old module names of the reference trainer that a config may still run with `-m`."""


def _renamed_module(cwd: Path, command: list[str]) -> tuple[int, str, str] | None:
    """(index, old, new) of the first `-m OLD` argument that names a renamed module, unless
    the trainer's working directory holds a module of that name of its own (`-m` would find
    it there)."""
    for i, arg in enumerate(command):
        if arg == "-m" and i + 1 < len(command):
            index, module = i + 1, command[i + 1]
        elif arg.startswith("-m") and len(arg) > 2 and not arg.startswith("--"):
            index, module = i, arg[2:]
        else:
            continue
        top, _, rest = module.partition(".")
        if top not in RENAMED_MODULES:
            continue
        if (cwd / f"{top}.py").exists() or (cwd / top).is_dir():
            return None
        new = RENAMED_MODULES[top] + (f".{rest}" if rest else "")
        return index, module, new
    return None


def check_trainer_command(cfg: Config) -> None:
    """Raise ConfigError if the trainer command runs `-m` a module that has been renamed
    (RENAMED_MODULES), suggesting the command with its new name."""
    path = cfg.path
    command = cfg.trainer.command
    renamed = _renamed_module(cfg.trainer_cwd, command)
    if renamed is None:
        return
    index, old, new = renamed
    fixed = [*command]
    fixed[index] = new if command[index] == old else f"-m{new}"
    raise ConfigError(
        f"{path}: 'trainer.command' runs `-m {old}`, a module that is now called {new}: "
        f"write command = {toml_value(fixed)} (or run the `trainwarden-trainer` script)"
    )


def _check_trainer_cwd(path: Path, cfg: Config) -> None:
    """[trainer] cwd must be a folder the trainer can start in."""
    cwd = cfg.trainer_cwd
    if not cwd.exists():
        raise invalid(
            path,
            "trainer.cwd",
            cfg.trainer.cwd,
            f"an existing folder, but {cwd} does not exist: create it, or name the folder the "
            'trainer expects to start in, for example cwd = "." (the run directory)',
        )
    if not cwd.is_dir():
        raise invalid(
            path,
            "trainer.cwd",
            cfg.trainer.cwd,
            f'a folder, but {cwd} is not one: name a folder, for example cwd = "."',
        )
    if not os.access(cwd, os.X_OK):
        raise invalid(
            path,
            "trainer.cwd",
            cfg.trainer.cwd,
            f"a folder the daemon's user may enter, but {cwd} is not searchable (chmod u+x it)",
        )


def trainer_program_problem(program: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Why `program` (a trainer argv[0], run in cwd with env's PATH) cannot be executed;
    "" if it can."""
    if not program:
        return "its first item, the program, is empty"
    if "/" in program:
        candidate = Path(program) if Path(program).is_absolute() else cwd / program
        found: str | None = str(candidate) if os.path.lexists(candidate) else None
        if found is None:
            return f"the program {program} does not exist"
    else:
        search = (env or {}).get("PATH", os.environ.get("PATH", os.defpath))
        found = shutil.which(program, path=search)
        if found is None:
            # which() skips folders and files without x: name what is there instead.
            for folder in search.split(os.pathsep):
                if (Path(folder or ".") / program).exists():
                    found = str(Path(folder or ".") / program)
                    break
            else:
                return f"the program {program} is not found on PATH"
    try:
        mode = os.stat(found).st_mode
    except OSError as exc:
        return f"the program {found} cannot be read: {exc.strerror or exc}"
    if stat.S_ISDIR(mode):
        return f"the program {found} is a folder, not an executable file"
    if not stat.S_ISREG(mode) or not os.access(found, os.X_OK):
        return (
            f"the program {found} is not executable (chmod +x it, or run it with its interpreter)"
        )
    return ""


PYTHON_PROGRAM = re.compile(r"^python[0-9.]*$")
SHELL_PROGRAMS = frozenset({"sh", "bash", "dash", "zsh"})
PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X"})
"""python's options that take the next item as their value."""


def trainer_script(command: list[str]) -> str | None:
    """The script an interpreter command runs (`python -u train.py ...`: "train.py"), or
    None: not a python or shell interpreter, or it runs no file (-m, -c, stdin)."""
    if not command:
        return None
    program = Path(command[0]).name
    python = bool(PYTHON_PROGRAM.match(program))
    if not python and program not in SHELL_PROGRAMS:
        return None
    items = iter(command[1:])
    for item in items:
        if item == "-" or item.startswith("-c") or (python and item.startswith("-m")):
            return None
        if item == "--":
            return next(items, None)
        if item.startswith("-"):
            if (python and item in PYTHON_VALUE_OPTIONS) or (not python and item in ("-o", "+o")):
                next(items, None)
            continue
        return item
    return None


def trainer_script_problem(command: list[str], cwd: Path) -> str:
    """Why the script an interpreter command names cannot be run from cwd; "" if it can
    (or the command names none)."""
    script = trainer_script(command)
    if script is None:
        return ""
    candidate = Path(script).expanduser()
    candidate = candidate if candidate.is_absolute() else cwd / candidate
    if not candidate.exists():
        where = "" if Path(script).is_absolute() else f" in {cwd}"
        return f"the script {script} does not exist{where}"
    if candidate.is_dir() and not (candidate / "__main__.py").is_file():
        return f"the script {script} is a folder"
    return ""


def check_trainer_program(cfg: Config) -> None:
    """Raise ConfigError unless the trainer's working directory is a folder and its program
    can be executed there, here and now.

    Checked by a starting daemon only: `init` and `install-unit` may write a config for a
    trainer that is installed later, or on another machine.
    """
    _check_trainer_cwd(cfg.path, cfg)
    command = cfg.trainer.command
    env = {**os.environ, **cfg.trainer.env}
    problem = trainer_program_problem(command[0], cfg.trainer_cwd, env)
    problem = problem or trainer_script_problem(command, cfg.trainer_cwd)
    if problem:
        raise ConfigError(
            f"{cfg.path}: 'trainer.command' = {json.dumps(command)} is invalid: {problem}; "
            'expected the trainer\'s argv, for example command = ["python", "train.py"]'
        )
