"""The data arms, read from the Python standard library installed on this machine.

`docs` is the docstrings of the stdlib's modules, `code` their source, `tests` the
source of the stdlib's own test suite. Each arm is a bounded, deterministic prefix of
its sorted file list, so start-up stays fast and the same installation always yields
the same bytes; a different Python installation changes an arm's fingerprint, which a
resume notices.
"""

from __future__ import annotations

import hashlib
import os
import re
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ARM_NAMES = ("docs", "code", "tests")
ARM_BYTES = 2 * 1024 * 1024
"""Each arm is capped at 2 MiB: plenty for a byte-level model, quick to read and hash."""
HOLDOUT_DIVISOR = 16
"""The last 1/16 of every arm is held out: never trained on, read only by evaluation
(`--eval-every`) and by `export`'s probe batch. The fingerprint covers both parts."""
MIN_ARM_BYTES = 64 * 1024
"""Less than this (a stdlib stripped of its tests) and the arm is left out."""
TEST_DIRS = {"test", "tests", "idle_test"}
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
# Every triple-quoted string, matched left to right so a closing quote is never taken
# for an opening one. Those that start their line are docstrings (or close enough for
# training data); parsing every module with ast instead would take seconds.
TRIPLE_QUOTED = re.compile(rb"[rRuU]?(\"\"\"|''')(.*?)\1", re.S)


@dataclass(frozen=True)
class Arm:
    name: str
    data: bytes

    @property
    def split_at(self) -> int:
        return len(self.data) - len(self.data) // HOLDOUT_DIVISOR

    @property
    def train(self) -> bytes:
        """The bytes training batches are drawn from."""
        return self.data[: self.split_at]

    @property
    def held_out(self) -> bytes:
        """The bytes validation batches are drawn from (never trained on)."""
        return self.data[self.split_at :]

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.data).hexdigest()[:16]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _python_files(root: Path) -> list[str]:
    found: list[str] = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS]
        found.extend(os.path.join(directory, f) for f in files if f.endswith(".py"))
    return sorted(os.path.relpath(path, root) for path in found)


def _is_test_file(relpath: str) -> bool:
    parts = relpath.split(os.sep)
    return any(part in TEST_DIRS for part in parts[:-1]) or parts[-1].startswith("test_")


def _read_all(root: Path, relpaths: Iterable[str]) -> Iterator[bytes]:
    for relpath in relpaths:
        try:
            yield (root / relpath).read_bytes()
        except OSError:
            continue


def _docstrings(sources: Iterable[bytes]) -> Iterator[bytes]:
    for source in sources:
        for match in TRIPLE_QUOTED.finditer(source):
            line_start = source.rfind(b"\n", 0, match.start()) + 1
            text = match.group(2).strip()
            if text and not source[line_start : match.start()].strip():
                yield text + b"\n\n"


def _take(chunks: Iterable[bytes], limit: int) -> bytes:
    taken: list[bytes] = []
    size = 0
    for chunk in chunks:
        taken.append(chunk[: limit - size])
        size += len(taken[-1])
        if size >= limit:
            break
    return b"".join(taken)


def build_arms(names: Iterable[str] = ARM_NAMES, limit: int = ARM_BYTES) -> dict[str, Arm]:
    """The named arms that have enough data on this machine, in the order asked."""
    root = stdlib_root()
    files = _python_files(root)
    code_files = [f for f in files if not _is_test_file(f)]
    test_files = [f for f in files if _is_test_file(f)]
    readers = {
        "docs": lambda: _docstrings(_read_all(root, code_files)),
        "code": lambda: _read_all(root, code_files),
        "tests": lambda: _read_all(root, test_files),
    }
    arms = {}
    for name in names:
        data = _take(readers[name](), limit)
        if len(data) >= MIN_ARM_BYTES:
            arms[name] = Arm(name, data)
    return arms
