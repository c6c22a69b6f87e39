"""The Prometheus endpoint, scraped over loopback with real HTTP requests."""

from __future__ import annotations

import asyncio
import math
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainwarden.supervisor.errors import ConfigError
from trainwarden.supervisor.serve.metrics import MetricsServer, parse_listen, start_metrics_server

pytestmark = pytest.mark.timeout(60)

SNAPSHOT: dict[str, Any] = {
    "run": "gpt2-124m",
    "state": "running",
    "step": 1200,
    "loss": 3.25,
    "loss_ema": 3.3,
    "tokens_per_s": 125000.0,
    "mfu": 0.41,
    "restarts": 2,
    "last_checkpoint_step": 1000,
    "last_checkpoint_age_s": 42.5,
    "gpu": {
        "index": 0,
        "name": "NVIDIA GeForce RTX 4090",
        "util_percent": 97,
        "mem_used_bytes": 20 * 2**30,
        "mem_total_bytes": 24 * 2**30,
        "temperature_c": 71,
        "power_w": 402.5,
    },
}


def scrape(server: MetricsServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(server.url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[MetricsServer] = []

    def start(snapshot: Any, **kwargs: Any) -> MetricsServer:
        server = start_metrics_server("127.0.0.1:0", snapshot, **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def test_the_run_figures_are_served(serve):
    server = serve(lambda: SNAPSHOT)
    assert server.host == "127.0.0.1" and server.port > 0
    samples = scrape(server)
    gpu = (("gpu", "0"), ("name", "NVIDIA GeForce RTX 4090"))
    expected = {
        ("trainwarden_info", (("run", "gpt2-124m"),)): 1.0,
        ("trainwarden_step", ()): 1200.0,
        ("trainwarden_loss", ()): 3.25,
        ("trainwarden_loss_ema", ()): 3.3,
        ("trainwarden_tokens_per_second", ()): 125000.0,
        ("trainwarden_mfu_ratio", ()): 0.41,
        ("trainwarden_restarts_total", ()): 2.0,
        ("trainwarden_checkpoint_newest_step", ()): 1000.0,
        ("trainwarden_checkpoint_age_seconds", ()): 42.5,
        ("trainwarden_gpu_utilization_ratio", gpu): 0.97,
        ("trainwarden_gpu_memory_used_bytes", gpu): float(20 * 2**30),
        ("trainwarden_gpu_memory_total_bytes", gpu): float(24 * 2**30),
        ("trainwarden_gpu_temperature_celsius", gpu): 71.0,
        ("trainwarden_gpu_power_watts", gpu): 402.5,
    }
    for key, value in expected.items():
        assert samples[key] == pytest.approx(value), key
    states = {k[1][0][1]: v for k, v in samples.items() if k[0] == "trainwarden_state"}
    assert states["running"] == 1.0 and states["crash_loop"] == 0.0
    assert sum(states.values()) == 1.0 and {"backoff", "diverged", "pivoting"} <= set(states)
    assert any(name.startswith("trainwarden_daemon_process_") for name, _ in samples)


def test_missing_figures_are_left_out_and_nan_is_kept(serve):
    snapshot = {"state": "backoff", "step": None, "loss": math.nan, "gpu": None, "mfu": None}
    samples = scrape(serve(lambda: snapshot))
    names = {name for name, _ in samples}
    assert "trainwarden_step" not in names and "trainwarden_mfu_ratio" not in names
    assert not [n for n in names if n.startswith("trainwarden_gpu_")]
    assert math.isnan(samples[("trainwarden_loss", ())])
    assert samples[("trainwarden_state", (("state", "backoff"),))] == 1.0


def test_each_scrape_takes_a_fresh_snapshot(serve):
    calls = []

    def snapshot() -> dict[str, Any]:
        calls.append(1)
        return {"step": len(calls)}

    server = serve(snapshot)
    assert calls == []  # registering and starting take no snapshot
    assert scrape(server)[("trainwarden_step", ())] == 1.0
    assert scrape(server)[("trainwarden_step", ())] == 2.0


async def test_the_snapshot_runs_on_the_daemon_loop(serve):
    loop = asyncio.get_running_loop()
    seen: list[int] = []

    def snapshot() -> dict[str, Any]:
        seen.append(threading.get_ident())
        return SNAPSHOT

    server = serve(snapshot, loop=loop)
    samples = await asyncio.to_thread(scrape, server)
    assert samples[("trainwarden_step", ())] == 1200.0
    assert seen == [threading.get_ident()]


def test_close_stops_serving(serve):
    server = start_metrics_server("127.0.0.1:0", lambda: SNAPSHOT)
    scrape(server)
    server.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)


@pytest.mark.parametrize(
    ("listen", "expected"),
    [("127.0.0.1:9108", ("127.0.0.1", 9108)), ("[::1]:9200", ("::1", 9200)),
     ("localhost:0", ("localhost", 0)), ("127.0.0.2:80", ("127.0.0.2", 80))],
)  # fmt: skip
def test_loopback_addresses_parse(listen: str, expected: tuple[str, int]):
    assert parse_listen(listen) == expected


@pytest.mark.parametrize(
    "listen", ["0.0.0.0:9108", "192.168.1.5:9108", "[::]:9108", "gpu-box:9108"]
)
def test_remote_addresses_need_allow_remote(listen: str):
    with pytest.raises(ConfigError) as caught:
        parse_listen(listen, source="/run/trainwarden.toml")
    message = str(caught.value)
    assert message.startswith("/run/trainwarden.toml: 'metrics.listen'")
    assert "'metrics.allow_remote' = true" in message
    assert parse_listen(listen, allow_remote=True)[1] == 9108


@pytest.mark.parametrize(
    "listen", ["9108", "127.0.0.1", "127.0.0.1:http", ":9108", "127.0.0.1:70000"]
)
def test_malformed_addresses_are_config_errors(listen: str):
    with pytest.raises(ConfigError, match=r"'metrics.listen' = .* expected HOST:PORT"):
        parse_listen(listen)


def test_a_remote_address_is_refused_before_binding():
    with pytest.raises(ConfigError, match="allow_remote"):
        start_metrics_server("0.0.0.0:0", lambda: SNAPSHOT)


# ----------------------------------------------------------------------------- under the daemon


@pytest.mark.timeout(120)
def test_the_daemon_serves_its_figures(tmp_path: Path):
    from tests.support import journal, running_daemon, scripted_run, wait_for

    run_dir = tmp_path / "run"
    scripted_run(run_dir, "--steps", "100000", "--dt", "0.02", metrics={"listen": "127.0.0.1:0"})
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 20, 60, what="steps")
        listening = next(r for r in journal(run_dir) if r["kind"] == "metrics_listening")
        with urllib.request.urlopen(listening["url"], timeout=10) as response:
            text = response.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("trainwarden_step", ())] >= 20
    assert samples[("trainwarden_loss", ())] == pytest.approx(
        5.0 - 0.001 * samples[("trainwarden_step", ())], abs=0.01
    )
    assert samples[("trainwarden_state", (("state", "running"),))] == 1.0
    assert samples[("trainwarden_restarts_total", ())] == 0.0


def test_a_remote_listen_address_stops_the_daemon_with_one_line(tmp_path: Path):
    import subprocess

    from tests.support import PYTHON, scripted_run

    run_dir = tmp_path / "run"
    scripted_run(run_dir, "--steps", "100000", "--dt", "0.02", metrics={"listen": "0.0.0.0:9108"})
    done = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "daemon", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "'metrics.allow_remote' = true" in done.stderr
