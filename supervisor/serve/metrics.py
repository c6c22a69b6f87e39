"""Prometheus metrics: `[metrics] listen = "127.0.0.1:9108"` serves the run's figures.

A custom collector turns one snapshot of the daemon's view into metric families at each
scrape, so nothing is kept twice and nothing is computed when nobody scrapes. The HTTP
server is prometheus_client's, in a daemon thread. The snapshot is taken on the daemon's
event loop when one is given (the loop owns the state; the scrape thread only waits for
it), so a scrape never reads half-updated figures.

Loopback only unless `allow_remote = true`: the figures say what the machine is doing,
which is nobody else's business by default.

Snapshot keys read (any may be missing or None; a None figure is simply not exported):
run, state, step, loss, loss_ema, tokens_per_s, mfu, restarts, last_checkpoint_step,
last_checkpoint_age_s, last_save_stall_s, last_save_write_s, gpu {index, name, util_percent, mem_used_bytes, mem_total_bytes,
temperature_c, power_w}, val {step, loss, extras} (the newest held-out evaluation; a
non-finite loss as "nan"/"inf"/"-inf"). These are the names of the daemon's status view.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trainwarden.supervisor.config_checks import parse_listen

PREFIX = "trainwarden"
SNAPSHOT_TIMEOUT_S = 2.0


def _phases() -> tuple[str, ...]:
    from trainwarden.supervisor.core.phases import Phase

    return tuple(str(phase) for phase in Phase)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _loss(value: Any) -> float | None:
    """A loss as the status view sends it: a number, or "nan" / "inf" / "-inf"."""
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return _number(value)


def _val_families(val: Any) -> Iterator[Any]:
    """The newest evaluation: its loss, step and each arm's loss (`val_ARM` extras)."""
    from prometheus_client.core import GaugeMetricFamily

    if not isinstance(val, Mapping):
        return
    loss, step = _loss(val.get("loss")), _number(val.get("step"))
    if loss is not None:
        yield GaugeMetricFamily(
            f"{PREFIX}_val_loss",
            "Held-out validation loss of the newest evaluation (NaN is reported, not acted on).",
            value=loss,
        )
    if step is not None:
        yield GaugeMetricFamily(
            f"{PREFIX}_val_step", "Training step of the newest evaluation.", value=step
        )
    extras = val.get("extras")
    arms = {
        key[4:]: number
        for key, value in (extras.items() if isinstance(extras, Mapping) else ())
        if isinstance(key, str) and key.startswith("val_") and key != "val_loss"
        and (number := _loss(value)) is not None
    }  # fmt: skip
    if arms:
        family = GaugeMetricFamily(
            f"{PREFIX}_val_arm_loss",
            "Held-out validation loss of each data arm at the newest evaluation.",
            labels=["arm"],
        )
        for arm, number in sorted(arms.items()):
            family.add_metric([arm], number)
        yield family


class RunCollector:
    """A prometheus_client collector over the daemon's snapshot callable."""

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]]) -> None:
        self.snapshot = snapshot

    def describe(self) -> list[Any]:
        # Registering must not take a snapshot: report no fixed descriptions.
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        snap = self.snapshot()
        run = str(snap.get("run") or "run")
        yield InfoMetricFamily(PREFIX, "The supervised run.", value={"run": run})

        def gauge(name: str, doc: str, value: Any, scale: float = 1.0) -> Iterator[Any]:
            number = _number(value)
            if number is not None:
                yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=number * scale)

        yield from gauge("step", "Last optimisation step the trainer logged.", snap.get("step"))
        yield from gauge(
            "loss",
            "Training loss of the last logged step (NaN after a divergence).",
            snap.get("loss"),
        )
        yield from gauge(
            "loss_ema", "Exponential moving average of the training loss.", snap.get("loss_ema")
        )
        yield from gauge(
            "tokens_per_second",
            "Training throughput over the rolling window, on the wall clock.",
            snap.get("tokens_per_s"),
        )
        yield from gauge(
            "mfu_ratio",
            "Model FLOPs utilisation over the rolling window, on the wall clock (0..1).",
            snap.get("mfu"),
        )
        yield from gauge(
            "checkpoint_age_seconds",
            "Seconds since the newest verified checkpoint was seen.",
            snap.get("last_checkpoint_age_s"),
        )
        yield from gauge(
            "checkpoint_newest_step",
            "Step of the newest verified checkpoint.",
            snap.get("last_checkpoint_step"),
        )
        yield from gauge(
            "checkpoint_stall_seconds",
            "Seconds the trainer's step loop waited for its newest reported save.",
            snap.get("last_save_stall_s"),
        )
        yield from gauge(
            "checkpoint_write_seconds",
            "Seconds the newest reported save took to write (in the background if asynchronous).",
            snap.get("last_save_write_s"),
        )
        yield from _val_families(snap.get("val"))
        restarts = _number(snap.get("restarts"))
        if restarts is not None:
            yield CounterMetricFamily(
                f"{PREFIX}_restarts",
                "Trainer starts after the first, whatever their cause.",
                value=restarts,
            )
        state = snap.get("state")
        if isinstance(state, str):
            family = GaugeMetricFamily(
                f"{PREFIX}_state",
                "1 for the daemon's current state, 0 for the others.",
                labels=["state"],
            )
            for phase in sorted(set(_phases()) | {state}):
                family.add_metric([phase], 1.0 if phase == state else 0.0)
            yield family
        gpu = snap.get("gpu")
        if isinstance(gpu, Mapping):
            labels = ["gpu", "name"]
            values = [str(gpu.get("index", 0)), str(gpu.get("name") or "")]
            for name, doc, key, scale in (
                ("gpu_utilization_ratio", "GPU utilisation (0..1).", "util_percent", 0.01),
                ("gpu_memory_used_bytes", "GPU memory in use.", "mem_used_bytes", 1.0),
                ("gpu_memory_total_bytes", "GPU memory in total.", "mem_total_bytes", 1.0),
                ("gpu_temperature_celsius", "GPU temperature.", "temperature_c", 1.0),
                ("gpu_power_watts", "GPU power draw.", "power_w", 1.0),
            ):
                number = _number(gpu.get(key))
                if number is not None and math.isfinite(number):
                    family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)
                    family.add_metric(values, number * scale)
                    yield family


def on_loop(
    loop: asyncio.AbstractEventLoop, snapshot: Callable[[], Mapping[str, Any]], timeout_s: float
) -> Callable[[], Mapping[str, Any]]:
    """A snapshot callable for another thread that runs `snapshot` on the loop and waits."""

    def call() -> Mapping[str, Any]:
        future: concurrent.futures.Future[Mapping[str, Any]] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(snapshot())
            except BaseException as exc:  # handed to the scrape thread, not the loop
                future.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return future.result(timeout_s)

    return call


@dataclass
class MetricsServer:
    """A running metrics endpoint; `close()` stops it."""

    host: str
    port: int
    _server: Any
    _thread: Any

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(
    listen: str,
    snapshot: Callable[[], Mapping[str, Any]],
    *,
    allow_remote: bool = False,
    loop: asyncio.AbstractEventLoop | None = None,
) -> MetricsServer:
    """Serve /metrics on `listen` in a daemon thread (port 0 picks a free port).

    With `loop`, snapshot runs on that event loop (pass the daemon's loop); without, it
    runs in the scrape thread and must be thread-safe. Raises ConfigError for a bad or
    non-loopback address, OSError if the port cannot be bound.
    """
    from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

    host, port = parse_listen(listen, allow_remote=allow_remote)
    source = snapshot if loop is None else on_loop(loop, snapshot, SNAPSHOT_TIMEOUT_S)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(source))
    ProcessCollector(namespace=f"{PREFIX}_daemon", registry=registry)
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(host, server.server_port, server, thread)
