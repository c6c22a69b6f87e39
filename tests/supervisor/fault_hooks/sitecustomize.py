"""A fault hook for the daemon under test, loaded through PYTHONPATH (never by production).

With TRAINWARDEN_TEST_DIE_AT_PIVOT_STAGE=STAGE, the process SIGKILLs itself right after
the journal has durably recorded a `state` whose pivot reached STAGE, before that
stage's effects start: a restarted daemon must then finish or undo the pivot.

With TRAINWARDEN_TEST_DIE_AT=POINT it SIGKILLs itself at a named point around a trainer's
spawn: `journal:KIND:before` / `journal:KIND:after` (a journal record of KIND, `spawn` or
`trainer_started`), `spawn:before` / `spawn:after` (the fork and exec of the trainer),
`identity:before` / `identity:after` (writing trainer.pid). POINT `delay:SECONDS` kills
it that long after the `spawn` record instead, wherever the daemon is by then.

With TRAINWARDEN_TEST_PAUSE_SPAWN=SECONDS each trainer start waits that long (on the event
loop, which goes on answering requests) right before the fork: a slow start, as a large
checkpoint's digest check or a previous start's processes being stopped make one.

With TRAINWARDEN_TEST_SLOW_EXIT=SECONDS a daemon's interpreter takes that long to end
after its run is over (its lock and pid file already let go), as a loaded machine's
teardown of threads and modules can.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.abc
import importlib.machinery
import os
import signal
import sys
import threading
import time
from typing import Any

STAGE = os.environ.get("TRAINWARDEN_TEST_DIE_AT_PIVOT_STAGE")
POINT = os.environ.get("TRAINWARDEN_TEST_DIE_AT")
PAUSE = os.environ.get("TRAINWARDEN_TEST_PAUSE_SPAWN")
SLOW_EXIT = os.environ.get("TRAINWARDEN_TEST_SLOW_EXIT")
JOURNAL_MODULE = "trainwarden.supervisor.store.journal"
PROCESS_MODULE = "trainwarden.supervisor.shell.process"


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _at(point: str) -> None:
    if point == POINT:
        _die()


def _wrap_journal(module: Any) -> None:
    original = module.Journal.append

    def append(self: Any, entry: Any, *args: Any, **kwargs: Any) -> Any:
        kind = entry["kind"]
        _at(f"journal:{kind}:before")
        result = original(self, entry, *args, **kwargs)
        _at(f"journal:{kind}:after")
        if kind == "spawn" and POINT and POINT.startswith("delay:"):
            timer = threading.Timer(float(POINT.split(":", 1)[1]), _die)
            timer.daemon = True
            timer.start()
        if STAGE and kind == "state":
            pivot = (entry.get("state") or {}).get("pivot") or {}
            if pivot.get("stage") == STAGE:
                _die()
        return result

    module.Journal.append = append


def _wrap_process(module: Any) -> None:
    spawn = module.spawn

    async def wrapped_spawn(*args: Any, **kwargs: Any) -> Any:
        if PAUSE:
            await asyncio.sleep(float(PAUSE))
        _at("spawn:before")
        proc = await spawn(*args, **kwargs)
        _at("spawn:after")
        return proc

    module.spawn = wrapped_spawn
    save = module.TrainerIdentity.save

    def wrapped_save(self: Any, path: Any) -> None:
        _at("identity:before")
        save(self, path)
        _at("identity:after")

    module.TrainerIdentity.save = wrapped_save


WRAPPERS = {JOURNAL_MODULE: _wrap_journal, PROCESS_MODULE: _wrap_process}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, wrap: Any) -> None:
        self.inner = inner
        self.wrap = wrap

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        self.wrap(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        wrap = WRAPPERS.get(name)
        if wrap is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, wrap)
        return spec


if STAGE or POINT or PAUSE:
    sys.meta_path.insert(0, _Finder())


def _slow_exit() -> None:
    if "trainwarden.supervisor.shell.daemon" in sys.modules:  # not the trainer's interpreter
        time.sleep(float(SLOW_EXIT or 0))


if SLOW_EXIT:
    atexit.register(_slow_exit)
