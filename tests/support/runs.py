"""Run directories: the one run factory, the two trainers tests supervise, and readers of
what a run leaves behind (journal, checkpoints, pid file).

`make_run` writes RUN/trainwarden.toml for any trainer command. `reference_run` and
`scripted_run` are its two presets: the reference trainer on CPU (bit-exact, slow to start),
and tests/scripted_trainer.py (scripted losses, starts in a fraction of a second).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from trainwarden.supervisor.config_toml import toml_key, toml_value
from trainwarden.supervisor.store.journal import read_records

PYTHON = sys.executable
TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
SCRIPTED_TRAINER = TESTS / "scripted_trainer.py"
REFERENCE_TRAINER = [PYTHON, "-m", "trainwarden.trainer"]

Table = Mapping[str, Any]


def merged(defaults: Mapping[str, Table], tables: Mapping[str, Table]) -> dict[str, dict[str, Any]]:
    """defaults with each of `tables` laid over its namesake key by key."""
    out = {name: dict(values) for name, values in defaults.items()}
    for name, values in tables.items():
        out[name] = {**out.get(name, {}), **values}
    return out


def make_run(run_dir: Path, command: Sequence[str], **tables: Table) -> Path:
    """A run directory whose trainwarden.toml supervises `command`: `[trainer] command` plus
    the given tables (name -> keys) exactly as given. Returns run_dir."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = merged({"trainer": {"command": list(command)}}, tables)
    lines = []
    for table, values in config.items():
        lines.append(f"[{toml_key(table)}]")
        lines += [f"{toml_key(key)} = {toml_value(value)}" for key, value in values.items()]
        lines.append("")
    (run_dir / "trainwarden.toml").write_text("\n".join(lines))
    return run_dir


# ----------------------------------------------------------------------------- the two trainers


def trainer_argv(steps: int, save_every: int, *extra: str, seed: int = 1337) -> list[str]:
    """The reference trainer, tiny preset on CPU, working in its current directory."""
    return [
        *REFERENCE_TRAINER,
        "--run-dir", ".", "--preset", "tiny", "--device", "cpu",
        "--steps", str(steps), "--save-every", str(save_every), "--seed", str(seed),
        *extra,
    ]  # fmt: skip


def scripted_argv(*args: str) -> list[str]:
    """tests/scripted_trainer.py with `args` (see its docstring: --steps is required)."""
    return [PYTHON, str(SCRIPTED_TRAINER), *args]


def reference_run(
    run_dir: Path, steps: int = 60, save_every: int = 10, *extra: str, **tables: Table
) -> Path:
    """A run of the reference trainer on CPU: quick restarts, keep_last 3, a 60 s stall
    timeout; `tables` override these per key."""
    defaults: dict[str, Table] = {
        "run": {"name": run_dir.name},
        "trainer": {"stop_timeout_s": 30.0, "total_steps": steps},
        "checkpoints": {"keep_last": 3},
        "restart": {
            "backoff_initial_s": 0.0,
            "backoff_max_s": 1.0,
            "max_restarts_without_progress": 5,
            "stall_timeout_s": 60.0,
        },
        "telemetry": {"vocab_size": 256, "n_params": "auto"},
    }
    return make_run(run_dir, trainer_argv(steps, save_every, *extra), **merged(defaults, tables))


def scripted_run(run_dir: Path, *args: str, **tables: Table) -> Path:
    """A run of tests/scripted_trainer.py with `args`: immediate restarts, a 10 s stop
    timeout and the 512 tokens per step its lines report; `tables` override these per key."""
    defaults: dict[str, Table] = {
        "trainer": {"stop_timeout_s": 10.0},
        "restart": {"backoff_initial_s": 0.0, "backoff_max_s": 1.0},
        "telemetry": {"tokens_per_step": 512},
    }
    return make_run(run_dir, scripted_argv(*args), **merged(defaults, tables))


# ----------------------------------------------------------------------------- what a run leaves


def journal(run_dir: Path) -> list[dict[str, Any]]:
    return list(read_records(run_dir / ".trainwarden" / "journal.jsonl"))


def journal_kinds(run_dir: Path) -> list[str]:
    return [r["kind"] for r in journal(run_dir)]


def checkpoints(run_dir: Path) -> list[int]:
    """Steps of the committed andrea-bin checkpoints, oldest first."""
    return sorted(int(p.name[5:-4]) for p in (run_dir / "checkpoints").glob("step_*.bin"))


def trainer_pid(run_dir: Path) -> int | None:
    """The pid the daemon recorded for its trainer, if any (check belongs_to_run before use)."""
    try:
        return int(orjson.loads((run_dir / ".trainwarden" / "trainer.pid").read_bytes())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def started_trainer_pids(run_dir: Path) -> set[int]:
    """Every trainer pid the journal records as started."""
    return {
        int(r["pid"])
        for r in journal(run_dir)
        if r.get("kind") == "trainer_started" and isinstance(r.get("pid"), int)
    }
