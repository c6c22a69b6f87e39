"""The project's calls into the C library, and its one view of raw memory: all its ctypes.

Every layer that needs one imports it from here (the daemon's inputs, store, shell, serve
and command line, and the reference trainer), so this module imports only the standard
library. The library is loaded once, on the first call that needs it. Each function says
what it does where its call is missing (another C library, another system, an old kernel
or file system): it returns False, raises `LibcUnavailable`, or does nothing, never
something half-done.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any, NoReturn

AT_FDCWD = -100
"""Paths relative to the working directory (fcntl.h)."""
RENAME_NOREPLACE = 1
"""renameat2: refuse to replace an existing target (linux/fs.h)."""
RENAME_EXCHANGE = 2
"""renameat2: swap the two names (linux/fs.h)."""
PR_SET_CHILD_SUBREAPER = 36
"""prctl: orphans of this process's descendants are re-parented to it (linux/prctl.h)."""
M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter: allocations from this size up get their own mapping."""
RENAME_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM})
"""renameat2's answers for a flag that the kernel or the file system does not support."""

_NOT_LOADED: Any = object()
_libc: Any = _NOT_LOADED
"""The C library once loaded; None where it could not be."""
_load_error = ""
"""Why the C library could not be loaded."""


class LibcUnavailable(OSError):
    """The C library, or the function asked for, is not available on this system."""


def _function(name: str, argtypes: list[Any]) -> Any:
    """The C library's function `name`, returning int, with these argument types."""
    global _libc, _load_error
    if _libc is _NOT_LOADED:
        try:
            # The running program's symbols: the C library Python itself is linked against.
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError as exc:
            _libc, _load_error = None, str(exc)
    if _libc is None:
        raise LibcUnavailable(_load_error or "the C library could not be loaded")
    try:
        function = getattr(_libc, name)
    except AttributeError as exc:
        raise LibcUnavailable(str(exc)) from None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


def _renameat2(source: str | os.PathLike[str], target: str | os.PathLike[str], flags: int) -> int:
    """renameat2's errno (0: done); raises LibcUnavailable where the C library lacks it."""
    renameat2 = _function(
        "renameat2", [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    )
    if renameat2(AT_FDCWD, os.fsencode(source), AT_FDCWD, os.fsencode(target), flags) == 0:
        return 0
    return ctypes.get_errno()


def rename_exchange(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Swap the names `a` and `b` in one step (renameat2 with RENAME_EXCHANGE); True when
    swapped. False, with nothing changed, where the system cannot: no renameat2 in the C
    library, or a kernel or file system without the flag. Any other failure is raised as
    the OSError of its errno, naming `a`."""
    return _rename(a, b, RENAME_EXCHANGE, named=a)


def rename_noreplace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> bool:
    """Rename `source` to `target` in one step unless `target` exists (renameat2 with
    RENAME_NOREPLACE); True when renamed. An existing `target` raises FileExistsError. False,
    with nothing changed, where the system cannot: no renameat2 in the C library, or a
    kernel or file system without the flag; the caller then checks and renames itself, with
    a window between the two. Any other failure is raised as the OSError of its errno,
    naming `target`."""
    return _rename(source, target, RENAME_NOREPLACE, named=target)


def _rename(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    flags: int,
    named: str | os.PathLike[str],
) -> bool:
    """renameat2 with `flags`: True when done, False where unsupported; any other failure
    the OSError of its errno naming `named` (FileExistsError for EEXIST)."""
    try:
        code = _renameat2(source, target, flags)
    except LibcUnavailable:
        return False
    if code == 0:
        return True
    if code in RENAME_UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(named))


def set_child_subreaper() -> None:
    """Make this process a child subreaper (prctl PR_SET_CHILD_SUBREAPER, Linux only): an
    orphan among its descendants is re-parented to it rather than to init. Raises
    LibcUnavailable where the C library has no prctl, and the OSError of its errno where
    prctl refuses."""
    prctl = _function(
        "prctl", [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    )
    if prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _raise_errno(call: str, path: bytes | None = None) -> NoReturn:
    """The OSError of the errno that `call` just left (its subclass: FileNotFoundError for
    ENOENT, ...), naming the call and `path`."""
    code = ctypes.get_errno()
    raise OSError(code, f"{call}: {os.strerror(code)}", None if path is None else os.fsdecode(path))


def inotify_init1(flags: int) -> int:
    """A new inotify instance's descriptor (inotify_init1(2)), opened with `flags`
    (IN_NONBLOCK, IN_CLOEXEC: os.O_NONBLOCK, os.O_CLOEXEC). Raises LibcUnavailable where
    the C library has no inotify (not Linux), and the OSError of its errno where the
    kernel refuses (EMFILE: fs.inotify.max_user_instances spent; ENOSYS)."""
    fd: int = _function("inotify_init1", [ctypes.c_int])(flags)
    if fd < 0:
        _raise_errno("inotify_init1")
    return fd


def inotify_add_watch(fd: int, path: str | bytes | os.PathLike[Any], mask: int) -> int:
    """Watch `path` for the events in `mask` on the inotify instance `fd`
    (inotify_add_watch(2)); returns the watch descriptor, the same one again for a path
    already watched. Raises the OSError of its errno naming `path` (FileNotFoundError for
    ENOENT; ENOSPC: fs.inotify.max_user_watches spent), and LibcUnavailable where the C
    library has no inotify."""
    raw = os.fsencode(path)
    add_watch = _function("inotify_add_watch", [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32])
    wd: int = add_watch(fd, raw, mask)
    if wd < 0:
        _raise_errno("inotify_add_watch", raw)
    return wd


def inotify_rm_watch(fd: int, wd: int) -> None:
    """Remove the watch `wd` from the inotify instance `fd` (inotify_rm_watch(2)); its
    IN_IGNORED event follows. Raises the OSError of its errno (EINVAL: no such watch, its
    file already gone), and LibcUnavailable where the C library has no inotify."""
    if _function("inotify_rm_watch", [ctypes.c_int, ctypes.c_int])(fd, wd) != 0:
        _raise_errno("inotify_rm_watch")


def _glibc_allocator() -> tuple[Any, Any] | None:
    """glibc's mallopt and malloc_trim; None where the C library lacks either (not glibc)."""
    try:
        return (
            _function("mallopt", [ctypes.c_int, ctypes.c_int]),
            _function("malloc_trim", [ctypes.c_size_t]),
        )
    except LibcUnavailable:
        return None


def set_mmap_threshold(size: int) -> bool:
    """Have glibc's malloc give every allocation of `size` bytes or more a mapping of its
    own, so that it goes back to the system when freed (mallopt M_MMAP_THRESHOLD); True
    when set. False, with nothing done, where the C library is not glibc."""
    allocator = _glibc_allocator()
    if allocator is None:
        return False
    mallopt, _ = allocator
    mallopt(M_MMAP_THRESHOLD, size)
    return True


def malloc_trim() -> bool:
    """Give the free pages of glibc's heap back to the system (malloc_trim(0)); True when
    called. False, with nothing done, where the C library is not glibc."""
    allocator = _glibc_allocator()
    if allocator is None:
        return False
    _, trim = allocator
    trim(0)
    return True


def memory_at(address: int, size: int) -> memoryview:
    """The `size` bytes of this process's memory from `address`, as bytes, not copied (a
    tensor's data, for one write). No C library call: available wherever Python runs. The
    caller keeps the memory's owner alive, and unchanged in size, while the view is used."""
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")
