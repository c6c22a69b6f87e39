"""trainwarden.libc: each call does its job on this machine, and each does what its docstring
promises where the call is missing. The project's ctypes stay in that one module."""

from __future__ import annotations

import ast
import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from trainwarden import libc
from trainwarden.supervisor.cli import branch
from trainwarden.supervisor.errors import UsageError
from trainwarden.supervisor.inputs import inotify
from trainwarden.supervisor.shell import containment

ROOT = Path(__file__).resolve().parent.parent
CTYPES_ALLOWED = frozenset({Path("trainwarden/libc.py")})
NOT_SCANNED = frozenset({".venv", "tests"})
"""The environment, and the tests."""
PACKAGES = ("supervisor", "tui", "trainer", "integrations", "plugins")
"""The installed folders: none of their modules imports ctypes."""

LIBC_MISSING = [
    pytest.param(None, id="no C library"),
    pytest.param(SimpleNamespace(), id="no such function"),
]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def no_libc(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libc, "_libc", request.param)


# ------------------------------------------------------------------------------ renameat2


def test_rename_exchange_swaps_two_files(tmp_path: Path):
    a, b = write(tmp_path / "a", "first"), write(tmp_path / "b", "second")
    assert libc.rename_exchange(a, b) is True
    assert (a.read_text(), b.read_text()) == ("second", "first")


def test_rename_exchange_swaps_two_folders(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    write(a / "old", ""), write(b / "new", "")
    assert libc.rename_exchange(a, b) is True
    assert [p.name for p in a.iterdir()] == ["new"]
    assert [p.name for p in b.iterdir()] == ["old"]


def test_rename_exchange_raises_other_failures_naming_the_first_path(tmp_path: Path):
    a = write(tmp_path / "a", "first")
    with pytest.raises(FileNotFoundError) as caught:
        libc.rename_exchange(a, tmp_path / "missing")
    assert caught.value.errno == errno.ENOENT
    assert caught.value.filename == str(a)
    assert a.read_text() == "first"


def test_rename_noreplace_renames_onto_a_free_name(tmp_path: Path):
    source = write(tmp_path / "source", "content")
    assert libc.rename_noreplace(source, tmp_path / "target") is True
    assert not source.exists()
    assert (tmp_path / "target").read_text() == "content"


def test_rename_noreplace_refuses_an_existing_target(tmp_path: Path):
    source, target = write(tmp_path / "source", "new"), write(tmp_path / "target", "old")
    with pytest.raises(FileExistsError) as caught:
        libc.rename_noreplace(source, target)
    assert caught.value.errno == errno.EEXIST
    assert caught.value.filename == str(target)
    assert (source.read_text(), target.read_text()) == ("new", "old")


def test_rename_noreplace_raises_other_failures(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        libc.rename_noreplace(tmp_path / "missing", tmp_path / "target")
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize("no_libc", LIBC_MISSING, indirect=True)
@pytest.mark.usefixtures("no_libc")
def test_without_renameat2_both_renames_return_false_and_change_nothing(tmp_path: Path):
    a, b = write(tmp_path / "a", "first"), write(tmp_path / "b", "second")
    assert libc.rename_exchange(a, b) is False
    assert libc.rename_noreplace(a, tmp_path / "free") is False
    assert libc.rename_noreplace(a, b) is False
    assert (a.read_text(), b.read_text()) == ("first", "second")
    assert not (tmp_path / "free").exists()


@pytest.mark.parametrize("code", sorted(libc.RENAME_UNSUPPORTED))
def test_a_kernel_or_file_system_without_the_flag_returns_false(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
):
    monkeypatch.setattr(libc, "_renameat2", lambda source, target, flags: code)
    assert libc.rename_exchange(tmp_path / "a", tmp_path / "b") is False
    assert libc.rename_noreplace(tmp_path / "a", tmp_path / "b") is False


@pytest.mark.parametrize("no_libc", LIBC_MISSING, indirect=True)
@pytest.mark.usefixtures("no_libc")
def test_a_branch_without_renameat2_still_refuses_an_existing_directory(tmp_path: Path):
    source, target = tmp_path / "staging", tmp_path / "dest"
    source.mkdir(), target.mkdir()
    with pytest.raises(UsageError, match="already exists"):
        branch._rename_noreplace(source, target)
    branch._rename_noreplace(source, tmp_path / "free")
    assert (tmp_path / "free").is_dir() and not source.exists()


def test_a_branch_onto_an_existing_directory_is_a_usage_error(tmp_path: Path):
    source, target = tmp_path / "staging", tmp_path / "dest"
    source.mkdir(), target.mkdir()
    with pytest.raises(UsageError, match="already exists"):
        branch._rename_noreplace(source, target)
    assert source.is_dir()


# ----------------------------------------------------------------------------------- prctl

ORPHAN_GOES_TO = textwrap.dedent(
    """
    import os, sys, time
    from trainwarden.libc import set_child_subreaper

    if sys.argv[1] == "subreaper":
        set_child_subreaper()
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        parent = os.getpid()
        if os.fork() == 0:
            # The orphan: wait for its parent to go, then say who adopted it.
            deadline = time.monotonic() + 10
            while os.getppid() == parent and time.monotonic() < deadline:
                time.sleep(0.01)
            os.write(write_end, str(os.getppid()).encode())
            os._exit(0)
        os._exit(0)
    os.close(write_end)
    os.waitpid(middle, 0)
    adopter = int(os.read(read_end, 32))
    print(adopter == os.getpid())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux only")
@pytest.mark.parametrize("mode", ["subreaper", "plain"])
def test_set_child_subreaper_adopts_the_orphans_of_descendants(mode: str):
    # In a process of its own: the test process stays as it was.
    done = subprocess.run(
        [sys.executable, "-c", ORPHAN_GOES_TO, mode],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(mode == "subreaper")


@pytest.mark.parametrize("no_libc", LIBC_MISSING, indirect=True)
@pytest.mark.usefixtures("no_libc")
def test_without_prctl_set_child_subreaper_raises_libc_unavailable():
    with pytest.raises(libc.LibcUnavailable):
        libc.set_child_subreaper()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux only")
def test_become_subreaper_says_why_not(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(libc, "_libc", SimpleNamespace())
    reason = containment.become_subreaper()
    assert reason is not None and reason.startswith("prctl unavailable: ")
    assert "prctl" in reason.removeprefix("prctl unavailable: ")

    def refused() -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(containment, "set_child_subreaper", refused)
    assert containment.become_subreaper() == (
        f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(errno.EPERM)}"
    )


# ---------------------------------------------------------------------------- glibc malloc


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc only",
)
def test_the_glibc_allocator_calls_are_made():
    assert libc.set_mmap_threshold(128 << 10) is True
    assert libc.malloc_trim() is True


@pytest.mark.parametrize("no_libc", LIBC_MISSING, indirect=True)
@pytest.mark.usefixtures("no_libc")
def test_without_glibc_the_allocator_calls_do_nothing():
    assert libc.set_mmap_threshold(128 << 10) is False
    assert libc.malloc_trim() is False


def test_a_c_library_with_only_one_of_the_two_is_not_glibc(monkeypatch: pytest.MonkeyPatch):
    calls: list[Any] = []

    def malloc_trim(pad: int) -> int:
        calls.append(pad)
        return 1

    monkeypatch.setattr(libc, "_libc", SimpleNamespace(malloc_trim=malloc_trim))
    assert libc.malloc_trim() is False
    assert libc.set_mmap_threshold(128 << 10) is False
    assert calls == []


# --------------------------------------------------------------------------------- inotify

IN_MODIFY, IN_IGNORED = inotify.IN_MODIFY, inotify.IN_IGNORED
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="inotify is Linux only"
)


def queued_events(fd: int) -> list[tuple[int, int]]:
    """(wd, mask) of each event queued on the inotify descriptor `fd` now."""
    try:
        data = os.read(fd, 4096)
    except BlockingIOError:
        return []
    return [(event.wd, event.mask) for event in inotify.parse_events(data)]


@linux_only
def test_an_inotify_watch_on_a_file_reports_its_writes(tmp_path: Path):
    watched = write(tmp_path / "log", "")
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        assert not os.get_inheritable(fd) and not os.get_blocking(fd)
        wd = libc.inotify_add_watch(fd, watched, IN_MODIFY)
        assert libc.inotify_add_watch(fd, os.fsencode(watched), IN_MODIFY) == wd
        assert queued_events(fd) == []
        with watched.open("a") as log:
            log.write("step: 1\n")
        assert queued_events(fd) == [(wd, IN_MODIFY)]
        libc.inotify_rm_watch(fd, wd)
        assert queued_events(fd) == [(wd, IN_IGNORED)]
        with pytest.raises(OSError) as caught:
            libc.inotify_rm_watch(fd, wd)
        assert caught.value.errno == errno.EINVAL
    finally:
        os.close(fd)


@linux_only
def test_an_inotify_watch_on_a_missing_path_raises_enoent_naming_it(tmp_path: Path):
    fd = libc.inotify_init1(os.O_CLOEXEC)
    try:
        with pytest.raises(FileNotFoundError) as caught:
            libc.inotify_add_watch(fd, tmp_path / "missing", IN_MODIFY)
        assert caught.value.errno == errno.ENOENT
        assert caught.value.filename == str(tmp_path / "missing")
    finally:
        os.close(fd)


@pytest.mark.parametrize("no_libc", LIBC_MISSING, indirect=True)
@pytest.mark.usefixtures("no_libc")
def test_without_inotify_each_call_and_the_watcher_raise_libc_unavailable(tmp_path: Path):
    for call in (
        lambda: libc.inotify_init1(os.O_CLOEXEC),
        lambda: libc.inotify_add_watch(0, tmp_path, IN_MODIFY),
        lambda: libc.inotify_rm_watch(0, 1),
    ):
        with pytest.raises(libc.LibcUnavailable):
            call()
    # An OSError: the log follower and the checkpoint watcher fall back to polling on it.
    with pytest.raises(libc.LibcUnavailable):
        inotify.Inotify()
    assert issubclass(libc.LibcUnavailable, OSError)


# ------------------------------------------------------------------------------ raw memory


def test_memory_at_views_the_bytes_in_place():
    array = np.arange(256, dtype=np.uint8)
    view = libc.memory_at(array.ctypes.data, array.nbytes)
    assert view.format == "B" and view.nbytes == 256
    assert bytes(view) == array.tobytes()
    array[7] = 0
    assert view[7] == 0, "a copy, not a view of the memory"
    assert bytes(libc.memory_at(array.ctypes.data, 0)) == b""


# ---------------------------------------------------------------------------- one module


def ctypes_imports(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name.split(".")[0] == "ctypes" for name in names):
            lines.append(node.lineno)
    return lines


def source_files() -> list[Path]:
    """Every .py file of the repository, relative to it, outside NOT_SCANNED and hidden
    folders (links are not followed: trainwarden/'s links lead to the folders beside it)."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder).relative_to(ROOT)
        if here == Path("."):
            dirs[:] = [d for d in dirs if d not in NOT_SCANNED]
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        found += [here / name for name in files if name.endswith(".py")]
    return sorted(found)


def test_ctypes_is_imported_only_by_the_libc_module():
    scanned, wrong = source_files(), []
    for relative in scanned:
        if relative not in CTYPES_ALLOWED:
            wrong += [f"{relative}:{line}" for line in ctypes_imports(ROOT / relative)]
    assert {path.parts[0] for path in scanned} >= set(PACKAGES)
    assert Path("supervisor/inputs/inotify.py") in scanned
    assert Path("trainwarden/libc.py") in scanned
    assert ctypes_imports(ROOT / "trainwarden/libc.py"), "the scan does not see an import"
    assert not wrong, "ctypes imported outside trainwarden/libc.py:\n  " + "\n  ".join(wrong)
