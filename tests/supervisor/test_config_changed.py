"""A config edited while the daemon runs is said to be changed, not silently ignored: the
daemon records the file's identity when it reads it, and `status`, the `state` topic and
the replies of `start` and `stop` say that the file changed and what to do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import journal_kinds, running_daemon, scripted_run, wait_for
from trainwarden.supervisor.cli.output import describe_result, format_status
from trainwarden.supervisor.shell import config_watch
from trainwarden.supervisor.shell.config_watch import ConfigWatch

pytestmark = pytest.mark.timeout(180)


def test_an_edit_is_a_change_and_the_same_bytes_written_again_are_not(tmp_path: Path):
    path = tmp_path / "trainwarden.toml"
    path.write_text("[trainer]\ntotal_steps = 2000\n")
    watch = ConfigWatch(path, tmp_path, read_at=0.0)
    assert not watch.changed() and watch.notice() is None
    # An editor's save of the same bytes: new mtime, same content.
    path.write_text("[trainer]\ntotal_steps = 2000\n")
    os.utime(path, ns=(1, 1))
    assert not watch.changed()
    path.write_text("[trainer]\ntotal_steps = 200000\n")
    assert watch.changed()
    notice = watch.notice()
    assert notice is not None and notice.startswith(
        "trainwarden.toml changed since the daemon read it at "
    )
    assert "the daemon still runs the old settings" in notice
    assert f"`trainwarden shutdown {tmp_path}` then `trainwarden daemon --detach {tmp_path}`" in (
        notice
    )
    path.write_text("[trainer]\ntotal_steps = 2000\n")  # put back: no change after all
    assert not watch.changed() and watch.notice() is None
    path.unlink()
    assert watch.changed()
    assert "trainwarden.toml is gone since the daemon read it" in (watch.notice() or "")


def test_the_file_is_read_again_only_when_its_stat_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = tmp_path / "trainwarden.toml"
    path.write_text("[trainer]\ntotal_steps = 2000\n")
    watch = ConfigWatch(path, tmp_path, read_at=0.0)
    digests: list[Path] = []
    real = config_watch.digest_of

    def counted(p: Path) -> str:
        digests.append(p)
        return real(p)

    monkeypatch.setattr(config_watch, "digest_of", counted)
    for _ in range(100):
        watch.changed()
    assert digests == []
    path.write_text("[trainer]\ntotal_steps = 200000\n")
    for _ in range(100):
        assert watch.changed()
    assert len(digests) == 1


def test_status_start_and_stop_say_the_config_changed(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps", "1000000", "--save-every", "20", "--dt", "0.01",
        trainer={"total_steps": 2000},
    )  # fmt: skip
    config = run_dir / "trainwarden.toml"
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 1, 60, what="a step")
        status = daemon.status()
        assert status["config_changed"] is False and status["config_notice"] is None
        config.write_text(config.read_text().replace("2000", "200000"))
        status = daemon.status()
        assert status["config_changed"] is True
        notice = status["config_notice"]
        assert notice.startswith("trainwarden.toml changed since the daemon read it at ")
        assert f"`trainwarden shutdown {run_dir}`" in notice
        assert status["total_steps"] == 2000  # what the daemon still runs
        assert f"config    {notice}" in format_status(status)  # type: ignore[arg-type]
        # The periodic check journals it once and pushes the state topic.
        wait_for(lambda: "config_changed" in journal_kinds(run_dir), 30, what="the record")

        stopped = daemon.request("stop")
        assert stopped["config_notice"] == notice
        assert describe_result("stop", stopped).endswith(notice)
        started = daemon.request("start")
        assert started["config_notice"] == notice
        assert notice in describe_result("start", started)
        # A refusal says it too: the trainer is running already.
        with pytest.raises(Exception, match="trainwarden.toml changed since the daemon read"):
            daemon.request("start")
    assert journal_kinds(run_dir).count("config_changed") == 1
