"""Where the control socket may be bound, and which group may reach it.

The daemon binds only where nobody else can: in the run's `.trainwarden/` (which it
creates and owns) or in a folder of the daemon's own user that gives others no access
(nor its group, except read and search for [control] group when allow_uids is set: 0710
or 0750). Whatever sits at the path must be absent or a socket of the daemon's user: the
daemon replaces a stale socket of its own and never unlinks anything else. Clients rely
on this (client.py): the uid that serves a socket is the owner of its folder.
"""

from __future__ import annotations

import grp
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from trainwarden.supervisor.errors import ConfigError
from trainwarden.supervisor.run_layout import STATE_DIR
from trainwarden.supervisor.wire import MAX_SOCKET_PATH

UNIX_PATH_MAX = 107
"""The longest address bind() and connect() take, in bytes."""
FD_ADDRESS = len("/proc/self/fd/") + 10 + 1
"""Bytes a long path's address spends before its name (wire.connect_path), fd digits included."""


@dataclass(frozen=True)
class SocketPlace:
    path: Path
    """The socket's path, its folder resolved."""
    state_dir: Path | None
    """The run's .trainwarden/ when the socket lies in it (the daemon sets its modes)."""
    gid: int | None
    """The group that may reach the socket ([control] group, when allow_uids is set)."""


def resolve_group(source: Path, group: str | int | None) -> int | None:
    """The gid [control] group names; ConfigError if there is no such group."""
    if group is None:
        return None
    try:
        if isinstance(group, int) or group.isdigit():
            return grp.getgrgid(int(group)).gr_gid
        return grp.getgrnam(group).gr_gid
    except (KeyError, OverflowError):
        raise ConfigError(
            f"{source}: 'control.group' = {group!r} is invalid: there is no such group on "
            "this machine; expected the name or gid of an existing group (see `getent group`)"
        ) from None


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _kind(st: os.stat_result) -> str:
    mode = st.st_mode
    if stat.S_ISSOCK(mode):
        return f"a socket of uid {st.st_uid}"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"


def check_socket_place(
    source: Path, run_dir: Path, socket: str, gid: int | None, uid: int | None = None
) -> SocketPlace:
    """Where `[control] socket` puts the socket, checked; ConfigError (one line) if the
    daemon may not bind there. `uid` is the daemon's (default: ours)."""
    uid = os.geteuid() if uid is None else uid
    path = run_dir / socket
    state_dir = (run_dir / STATE_DIR).resolve()
    open_to = f"0710 and group {group_name(gid)}" if gid is not None else "0700"
    valid = (
        f"a socket path in the run's {STATE_DIR}/ (the default, "
        f"'{STATE_DIR}/control.sock') or in an existing folder of uid {uid} with mode {open_to}"
    )

    def bad(why: str) -> ConfigError:
        return ConfigError(
            f"{source}: 'control.socket' = {socket!r} is invalid: {why}; expected {valid}"
        )

    if "\0" in socket:
        raise bad("it contains a NUL byte, which no path can hold")
    name = path.name
    if name in ("", ".", ".."):
        raise bad("it names a folder, not a socket")
    if len(str(path).encode()) > MAX_SOCKET_PATH and len(name.encode()) + FD_ADDRESS > (
        UNIX_PATH_MAX
    ):
        raise bad(
            f"its file name is {len(name.encode())} bytes, more than a Unix socket address "
            f"can hold ({UNIX_PATH_MAX - FD_ADDRESS} at most for a path over "
            f"{MAX_SOCKET_PATH} bytes)"
        )
    folder = path.parent.resolve()
    inside = folder == state_dir or state_dir in folder.parents
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        if not inside:
            raise bad(f"its folder {folder} does not exist") from None
        st = None
    except OSError as exc:
        raise bad(f"its folder {folder} cannot be read ({exc.strerror})") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise bad(f"{folder} is not a folder")
        if st.st_uid != uid:
            raise bad(f"its folder {folder} belongs to uid {st.st_uid}, not the daemon's")
        mode = stat.S_IMODE(st.st_mode)
        if folder != state_dir:  # the daemon sets the state folder's modes itself
            group_may = 0o050 if gid is not None and st.st_gid == gid else 0
            if mode & 0o077 & ~group_may:
                raise bad(f"its folder {folder} is open to others (mode {mode:04o})")
            if gid is not None and not (st.st_gid == gid and mode & 0o010):
                raise bad(
                    f"its folder {folder} does not let group {group_name(gid)} in "
                    f"(mode {mode:04o}, group {group_name(st.st_gid)})"
                )
    target = folder / name
    try:
        there = os.lstat(target)
    except FileNotFoundError:
        there = None
    except OSError as exc:
        raise bad(f"{target} cannot be read ({exc.strerror})") from None
    if there is not None and not (stat.S_ISSOCK(there.st_mode) and there.st_uid == uid):
        raise bad(f"{target} is {_kind(there)}, which the daemon never replaces")
    return SocketPlace(target, state_dir if inside else None, gid)


def check_group_member(source: Path, gid: int) -> None:
    """The daemon's user must be in [control] group to give the socket that group."""
    if os.geteuid() == 0 or gid == os.getegid() or gid in os.getgroups():
        return
    raise ConfigError(
        f"{source}: 'control.group' = {group_name(gid)!r} is invalid: the daemon's user "
        f"(uid {os.geteuid()}) is not a member, so it cannot give the socket that group; "
        "expected a group of the daemon's user (see `id`)"
    )
