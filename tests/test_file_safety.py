"""What the daemon may touch on disk: modes of the files it creates, paths that cannot leave
the run directory whatever a name or a step says, symlinks never followed to move or delete
their targets nor to write, append to or chmod them, and no code path that unpickles a
checkpoint.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from pathlib import Path

import pytest

from tests.support import PYTHON, DaemonProcess, journal, running_daemon, scripted_run, wait_for
from trainwarden.plugins.formats.andrea_bin import AndreaBin, checkpoint_name
from trainwarden.supervisor.errors import UnsafePath
from trainwarden.supervisor.shell.daemon import archive_dir
from trainwarden.supervisor.shell.process import spawn, spawn_failure
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.lossdb import LossWriter
from trainwarden.supervisor.store.rundir import RunFiles, acquire_lock, write_atomic

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
TRAINER_ARGS = ("--steps", "100000000", "--save-every", "20", "--dt", "0.02")
"""The scripted trainer: effectively endless, a checkpoint every 20 steps (0.4 s)."""


def andrea_bin(step: int, n_params: int = 4) -> bytes:
    return struct.pack("<ii", step, n_params) + bytes(12 * n_params)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# ----------------------------------------------------------------------------- modes


def test_daemon_files_are_private_even_under_a_permissive_umask(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", *TRAINER_ARGS)
    daemon = DaemonProcess(run_dir)
    old = os.umask(0)
    try:
        daemon.start(wait=False)
    finally:
        os.umask(old)
    try:
        daemon.wait_ready()
        daemon.wait_state("running", timeout=60)
        state_dir = run_dir / ".trainwarden"
        sock = state_dir / "control.sock"
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        assert mode(state_dir) == 0o700
        assert mode(sock) == 0o600
        assert mode(state_dir / "journal.jsonl") == 0o600
        assert mode(state_dir / "lock") == 0o600
        # Nothing the daemon made in its own folder is readable by others.
        for path in state_dir.iterdir():
            assert mode(path) & 0o077 == 0 or path.name == "daemon.pid", (path, oct(mode(path)))
    finally:
        daemon.cleanup()


# ----------------------------------------------------------------------------- hostile names


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    directory = tmp_path / "run" / "checkpoints"
    directory.mkdir(parents=True)
    return CheckpointStore(directory, AndreaBin())


HOSTILE_NAMES = [
    "",
    ".",
    "..",
    "../outside.bin",
    "../../etc/passwd",
    "/etc/passwd",
    "quarantine/../../outside.bin",
    "sub/step_000010.bin",
    "step_000010.bin\x00.txt",
    "step_000010.bin/..",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_child_refuses_names_that_leave_the_checkpoint_directory(store: CheckpointStore, name: str):
    with pytest.raises(ValueError, match="refusing checkpoint name"):
        store._child(name)


@pytest.mark.parametrize("name", ["../outside.bin", "../../outside.bin", "/tmp/x/outside.bin"])
def test_quarantine_and_delete_never_touch_a_file_outside(store: CheckpointStore, name: str):
    outside = store.dir.parent / "outside.bin"
    outside.write_bytes(andrea_bin(1))
    with pytest.raises(ValueError):
        store.quarantine(name)
    with pytest.raises(ValueError):
        store.delete(name)
    assert outside.read_bytes() == andrea_bin(1)
    assert not (store.dir / "quarantine" / "outside.bin").exists()


def test_hostile_companions_of_a_format_are_ignored(tmp_path: Path):
    """A format plugin that names companions outside the directory moves and deletes only
    what is inside it."""
    directory = tmp_path / "run" / "checkpoints"
    directory.mkdir(parents=True)
    victim = tmp_path / "victim.json"
    victim.write_text("keep me")
    sibling = tmp_path / "run" / "sibling.json"
    sibling.write_text("keep me too")

    class Hostile(AndreaBin):
        def companions(self, path: Path) -> list[Path]:
            return [victim, path.parent / ".." / "sibling.json", Path("/etc/passwd")]

    store = CheckpointStore(directory, Hostile())
    for step in (10, 20):
        (directory / checkpoint_name(step)).write_bytes(andrea_bin(step))
    store.quarantine(checkpoint_name(10))
    store.delete(checkpoint_name(20))
    assert victim.read_text() == "keep me" and sibling.read_text() == "keep me too"
    assert sorted(os.listdir(directory / "quarantine")) == [checkpoint_name(10)]


def test_a_step_number_cannot_steer_quarantine_names(store: CheckpointStore):
    """Quarantine targets are the member's own name inside quarantine/, whatever the step."""
    name = checkpoint_name(10**12)  # a step no header can hold
    (store.dir / name).write_bytes(b"junk")
    verdict = store.verify(name)
    assert verdict.info is None
    assert store.quarantine(name) == [name]
    assert (store.dir / "quarantine" / name).read_bytes() == b"junk"


# ----------------------------------------------------------------------------- archive paths


@pytest.mark.parametrize(
    "relative",
    [
        "archive/../../outside",
        "archive/../pivot-000010-x",
        "../archive/pivot-000010-x",
        "/tmp/archive/pivot-000010-x",
        "archive/pivot-000010-x/../../../outside",
        "archive/sub/pivot-000010-x",
        "archive/not-a-pivot",
        "archive",
        "archive/pivot-000010-x/..",
    ],
)
def test_archive_dir_refuses_paths_outside_run_archive(tmp_path: Path, relative: str):
    run_dir = tmp_path / "run"
    (run_dir / "archive").mkdir(parents=True)
    with pytest.raises(OSError, match="refusing archive path"):
        archive_dir(run_dir, relative)


def test_archive_dir_accepts_a_pivot_folder_and_refuses_one_linked_outside(tmp_path: Path):
    run_dir = tmp_path / "run"
    (run_dir / "archive").mkdir(parents=True)
    good = archive_dir(run_dir, "archive/pivot-000010-20240101T000000Z")
    assert good == (run_dir / "archive" / "pivot-000010-20240101T000000Z").resolve()
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_dir / "archive" / "pivot-000020-x").symlink_to(outside)
    with pytest.raises(OSError, match="refusing archive path"):
        archive_dir(run_dir, "archive/pivot-000020-x")


def test_archive_dir_refuses_an_archive_folder_that_links_outside(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_dir / "archive").symlink_to(outside)
    with pytest.raises(OSError, match="refusing archive path"):
        archive_dir(run_dir, "archive/pivot-000010-x")


# ----------------------------------------------------------------------------- symlinks


def test_verify_refuses_a_symlink_even_to_a_valid_checkpoint(
    store: CheckpointStore, tmp_path: Path
):
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(andrea_bin(30))
    (store.dir / checkpoint_name(30)).symlink_to(target)
    verdict = store.verify(checkpoint_name(30))
    assert verdict.info is None and "symbolic link" in verdict.reason


def test_quarantine_moves_a_dangling_symlink_itself(store: CheckpointStore, tmp_path: Path):
    link = store.dir / checkpoint_name(40)
    link.symlink_to(tmp_path / "gone.bin")
    assert store.verify(link.name).info is None
    assert store.quarantine(link.name) == [link.name]
    assert not os.path.lexists(link)
    assert (store.dir / "quarantine" / link.name).is_symlink()


def test_stale_in_flight_symlink_to_a_directory_is_unlinked_not_followed(
    store: CheckpointStore, tmp_path: Path
):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data.txt").write_text("keep")
    (store.dir / (checkpoint_name(50) + ".tmp")).symlink_to(outside)
    assert store.remove_stale_in_flight() == [checkpoint_name(50) + ".tmp"]
    assert (outside / "data.txt").read_text() == "keep"
    assert not os.path.lexists(store.dir / (checkpoint_name(50) + ".tmp"))


def test_daemon_quarantines_checkpoint_symlinks_as_links(tmp_path: Path):
    """At start-up and live: a step_N.bin that is a link (valid target outside, dangling,
    or a stale .tmp link to a folder) is moved into quarantine/ as the link; the targets
    keep every byte and the run resumes from the real checkpoint."""
    run_dir = scripted_run(tmp_path / "run", *TRAINER_ARGS)
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir()
    (ckpts / checkpoint_name(10)).write_bytes(andrea_bin(10, 1000))
    outside = tmp_path / "outside"
    outside.mkdir()
    valid_target = outside / "valid.bin"
    valid_target.write_bytes(andrea_bin(90, 1000))
    (ckpts / checkpoint_name(90)).symlink_to(valid_target)
    (ckpts / checkpoint_name(91)).symlink_to(outside / "missing.bin")
    (outside / "folder").mkdir()
    (outside / "folder" / "keep.txt").write_text("keep")
    (ckpts / (checkpoint_name(92) + ".tmp")).symlink_to(outside / "folder")
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running", timeout=60)
        spawn = next(r for r in journal(run_dir) if r["kind"] == "spawn")
        assert spawn["resume"]["step"] == 10
        quarantined = {r["name"] for r in journal(run_dir) if r["kind"] == "quarantine"}
        assert {checkpoint_name(90), checkpoint_name(91)} <= quarantined
        # Live: a link renamed into place (the commit event) is quarantined too.
        live_target = outside / "live.bin"
        live_target.write_bytes(andrea_bin(95, 1000))
        staging = run_dir / "staging-link"
        staging.symlink_to(live_target)
        os.replace(staging, ckpts / checkpoint_name(95))
        wait_for(
            lambda: (ckpts / "quarantine" / checkpoint_name(95)).is_symlink(),
            10,
            what="the live link in quarantine/",
        )
        assert all(c["step"] != 95 for c in daemon.request("checkpoints")["checkpoints"])
        assert daemon.status()["state"] == "running"
    for name in (checkpoint_name(90), checkpoint_name(91)):
        assert (ckpts / "quarantine" / name).is_symlink()
    assert valid_target.read_bytes() == andrea_bin(90, 1000)
    assert live_target.read_bytes() == andrea_bin(95, 1000)
    assert (outside / "folder" / "keep.txt").read_text() == "keep"


# ----------------------------------------------------------------------------- no unpickling

UNPICKLING = [
    (re.compile(r"\bpickle\.loads?\s*\("), "pickle.load/pickle.loads"),
    (re.compile(r"\b(?:pickle\.Unpickler|dill\.loads?|joblib\.load)\b"), "another unpickler"),
]
TORCH_LOAD = re.compile(r"\btorch\.load\s*\(")


def _calls(text: str, start: int) -> str:
    """The text of the call opened at `start` (up to its matching parenthesis)."""
    depth = 0
    for i in range(text.index("(", start), len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start : i + 1]
    return text[start:]


def test_no_code_path_unpickles_a_checkpoint():
    offenders = []
    for package in ("supervisor", "plugins", "tui"):
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            for pattern, what in UNPICKLING:
                for match in pattern.finditer(text):
                    line = text.count("\n", 0, match.start()) + 1
                    offenders.append(f"{path.relative_to(ROOT)}:{line}: {what}")
            for match in TORCH_LOAD.finditer(text):
                call = _calls(text, match.start())
                if not re.search(r"weights_only\s*=\s*True", call):
                    line = text.count("\n", 0, match.start()) + 1
                    offenders.append(
                        f"{path.relative_to(ROOT)}:{line}: torch.load without weights_only=True"
                    )
    assert not offenders, "unpickling code paths:\n" + "\n".join(offenders)


def unpickles(source: str) -> bool:
    if any(pattern.search(source) for pattern, _ in UNPICKLING):
        return True
    return any(
        not re.search(r"weights_only\s*=\s*True", _calls(source, m.start()))
        for m in TORCH_LOAD.finditer(source)
    )


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("state = pickle.load(f)", True),
        ("state = pickle.loads(blob)", True),
        ("obj = torch.load(path)", True),
        ("obj = torch.load(\n    path,\n    map_location='cpu',\n)", True),
        ("obj = torch.load(path, weights_only=False)", True),
        ("obj = torch.load(path, weights_only=True)", False),
        ("obj = torch.load(\n    path, map_location='cpu', weights_only=True\n)", False),
        ("data = orjson.loads(blob)", False),
    ],
)
def test_the_unpickling_check_tells_each_form_apart(source: str, caught: bool):
    assert unpickles(source) is caught


def test_a_quarantine_that_cannot_be_made_does_not_kill_the_daemon(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", *TRAINER_ARGS)
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir()
    (ckpts / checkpoint_name(10)).write_bytes(andrea_bin(10, 1000))
    (ckpts / checkpoint_name(20)).write_bytes(b"truncated")
    (ckpts / "quarantine").write_text("a file where the folder should be")
    daemon = DaemonProcess(run_dir)

    def answers_or_exited() -> bool:
        assert daemon.proc is not None
        if daemon.proc.poll() is not None:
            return True
        try:
            daemon.request("hello", timeout=2.0)
        except Exception:
            return False
        return True

    try:
        daemon.start(wait=False)
        wait_for(answers_or_exited, 30, what="the daemon to answer or exit")
        assert daemon.proc is not None and daemon.proc.poll() is None, daemon.stderr()[-1500:]
        assert daemon.status()["state"] in ("starting", "running")
    finally:
        daemon.cleanup()


# ----------------------------------------------------------------------------- links at files the daemon writes


def outside_file(tmp_path: Path) -> Path:
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(b"keep me\n")
    target.chmod(0o644)
    return target


def test_the_state_folder_as_a_link_is_refused_and_its_target_not_chmodded(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = tmp_path / "shared"
    target.mkdir()
    target.chmod(0o755)
    (run_dir / ".trainwarden").symlink_to(target)
    with pytest.raises(UnsafePath, match=r"\.trainwarden is a symbolic link \(to .*shared\)"):
        acquire_lock(RunFiles(run_dir))
    assert mode(target) == 0o755 and list(target.iterdir()) == []


def test_a_state_folder_that_is_a_file_is_refused(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".trainwarden").write_text("not a folder")
    with pytest.raises(UnsafePath, match="is not a folder"):
        RunFiles(run_dir).make_state_dir()


@pytest.mark.parametrize("opener", ["journal", "loss history"])
def test_appended_files_are_never_opened_through_a_link(tmp_path: Path, opener: str):
    target = outside_file(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UnsafePath, match="is a symbolic link"):
        if opener == "journal":
            Journal(link)
        else:
            LossWriter(link)
    assert target.read_bytes() == b"keep me\n"


def test_an_atomic_write_does_not_follow_a_link_planted_at_its_temporary_name(tmp_path: Path):
    target = outside_file(tmp_path)
    path = tmp_path / "trainer.pid"
    (tmp_path / f".trainer.pid.{os.getpid()}.tmp").symlink_to(target)
    write_atomic(path, b"123\n")
    assert path.read_bytes() == b"123\n" and not path.is_symlink()
    assert target.read_bytes() == b"keep me\n"


async def test_the_trainer_output_is_not_appended_through_a_link(tmp_path: Path):
    target = outside_file(tmp_path)
    log = tmp_path / "training.log"
    log.symlink_to(target)
    argv = ["/bin/echo", "a line"]
    with pytest.raises(OSError) as caught:
        await spawn(argv, tmp_path, dict(os.environ), log)
    message = spawn_failure(argv, tmp_path, dict(os.environ), caught.value)
    assert (
        message
        == f"cannot open the run log {log}: it is a symbolic link, and the daemon appends through no link"
    )
    assert target.read_bytes() == b"keep me\n"


async def test_a_run_log_that_is_a_folder_is_named_as_such(tmp_path: Path):
    (tmp_path / "training.log").mkdir()
    argv = [PYTHON, "-c", "pass"]
    with pytest.raises(OSError) as caught:
        await spawn(argv, tmp_path, dict(os.environ), tmp_path / "training.log")
    message = spawn_failure(argv, tmp_path, dict(os.environ), caught.value)
    assert message.endswith("training.log: it is a folder") and PYTHON not in message


@pytest.mark.parametrize(
    ("program", "says"),
    [
        ("", "its first item, the program, is empty"),
        ("./tools", "tools is a folder, not an executable file"),
        ("./notes.txt", "notes.txt is not executable"),
        ("./missing.sh", "the program ./missing.sh does not exist"),
    ],
)
async def test_a_program_that_cannot_run_is_named_for_what_it_is(
    tmp_path: Path, program: str, says: str
):
    (tmp_path / "tools").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    argv = [program]
    with pytest.raises(OSError) as caught:
        await spawn(argv, tmp_path, dict(os.environ), tmp_path / "training.log")
    message = spawn_failure(argv, tmp_path, dict(os.environ), caught.value)
    assert says in message and "Permission denied" not in message, message
