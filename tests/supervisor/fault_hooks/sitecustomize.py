"""A fault hook for the daemon under test, loaded through PYTHONPATH (never by production).

With TRAINWARDEN_TEST_DIE_AT_PIVOT_STAGE=STAGE, the process SIGKILLs itself right after
the journal has durably recorded a `state` whose pivot reached STAGE, before that
stage's effects start: a restarted daemon must then finish or undo the pivot.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import signal
import sys
from typing import Any

STAGE = os.environ.get("TRAINWARDEN_TEST_DIE_AT_PIVOT_STAGE")
JOURNAL_MODULE = "trainwarden.supervisor.store.journal"


def _wrap(module: Any) -> None:
    original = module.Journal.append

    def append(self: Any, kind: str, fields: Any = None, *args: Any, **kwargs: Any) -> Any:
        result = original(self, kind, fields, *args, **kwargs)
        if kind == "state" and isinstance(fields, dict):
            pivot = (fields.get("state") or {}).get("pivot") or {}
            if pivot.get("stage") == STAGE:
                os.kill(os.getpid(), signal.SIGKILL)
        return result

    module.Journal.append = append


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _wrap(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != JOURNAL_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if STAGE:
    sys.meta_path.insert(0, _Finder())
