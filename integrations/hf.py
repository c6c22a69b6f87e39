"""The trainer contract for the Hugging Face `Trainer`, in one callback.

    from trainwarden.integrations.hf import TrainwardenCallback, resume_from_checkpoint

    trainer = Trainer(..., callbacks=[TrainwardenCallback()])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())

Under the daemon (TRAINWARDEN_RUN_DIR set) the callback catches SIGUSR1 and SIGTERM from
the moment it is constructed, so the daemon's `save` and `stop` are not refused while the
Trainer is still being built. A handler only sets a flag; at the next step end the
callback asks the Trainer to save (SIGUSR1) or to save and stop (SIGTERM): `train()`
returns and the script ends with exit status 0. It also adds the Trainer's `global_step`
to each logged dict as `step`, so the printed lines carry their true step and the daemon
never has to count them.

transformers' own `enable_jit_checkpoint=True` installs a SIGTERM handler while the
Trainer is built, after the callback's; the callback takes SIGTERM back when the Trainer
is built (`on_init_end`, and again at `on_train_begin` for a callback added later), so a
stop saves at a step boundary, never in the middle of a step.

Under torchrun (`args.world_size` > 1) the requests are all-reduced at each step end, so a
signal any rank got makes every rank save (and stop) at the same step.

Outside the daemon the callback installs nothing and changes nothing, and
`resume_from_checkpoint()` returns its `default`.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import importlib
import signal
import sys
import threading
from typing import Any

from trainwarden.integrations.loop import Requests, any_rank, resume_path, under_daemon

INSTALL_HINT = "pip install 'trainwarden[hf]'"
CLOSE_BARRIER_S = 10.0
"""How long a rank waits at exit for its peers before it closes its process group."""


def _close_process_group() -> None:
    """Destroy torch.distributed's default group if the script left it (at exit).

    The Trainer never destroys the group it joined; with gloo, a worker whose group is
    still alive when the interpreter exits can abort in its C++ teardown ("terminate
    called without an active exception", SIGABRT) after a clean `train()`, which the agent
    and then the daemon would report as a crash of a run that had saved and stopped.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return
    with contextlib.suppress(Exception):
        # Every rank reaches the end before any tears its group down: a gloo worker whose
        # peer has already closed the connections can abort in the same teardown. Bounded,
        # so a rank whose peers died does not wait for them.
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=CLOSE_BARRIER_S))
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def resume_from_checkpoint(default: str | bool | None = None) -> str | bool | None:
    """The value for `trainer.train(resume_from_checkpoint=...)`: the checkpoint folder the
    daemon chose (TRAINWARDEN_RESUME; None for a fresh start) under the daemon, else
    `default` (what the script would pass on its own)."""
    return resume_path() if under_daemon() else default


def _transformers_callback_base() -> type:
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise ImportError(f"TrainwardenCallback needs transformers: {INSTALL_HINT}") from None
    base: type = transformers.TrainerCallback
    return base


_WITH_BASE: dict[type, type] = {}


def _with_transformers_base(cls: type) -> type:
    """`cls` with transformers' TrainerCallback as a base too, made once per class (so a
    subclass of TrainwardenCallback is a TrainerCallback as well)."""
    if cls not in _WITH_BASE:
        base = _transformers_callback_base()
        if issubclass(cls, base):
            return cls
        _WITH_BASE[cls] = type(
            cls.__name__,
            (cls, base),
            {
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
                "__doc__": cls.__doc__,
            },
        )
    return _WITH_BASE[cls]


class TrainwardenCallback:
    """A `transformers.TrainerCallback` that makes the Trainer honour the daemon's `save`
    (SIGUSR1: save at the next step end, go on) and `stop` (SIGTERM: save at the next step
    end and end training); it does nothing outside the daemon.

    transformers is imported when the callback is constructed, not when this module is.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> TrainwardenCallback:
        cls = _with_transformers_base(cls)
        instance: TrainwardenCallback = super().__new__(cls)
        return instance

    def __init__(self) -> None:
        self.active = under_daemon()
        self.requests = Requests()
        self.installed = False
        if self.active:
            self.install_handlers()

    def install_handlers(self) -> None:
        """Catch SIGUSR1 and SIGTERM (again, if the Trainer took SIGTERM meanwhile)."""
        if not self.active or threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        if signal.getsignal(signal.SIGUSR1) != self.requests.on_sigusr1:
            signal.signal(signal.SIGUSR1, self.requests.on_sigusr1)
        if signal.getsignal(signal.SIGTERM) != self.requests.on_sigterm:
            # enable_jit_checkpoint's handler would save mid-step three seconds later.
            signal.signal(signal.SIGTERM, self.requests.on_sigterm)
        self.installed = True

    # The events the Trainer calls (transformers.TrainerCallback's signatures).

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.install_handlers()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.install_handlers()
        if self.active and args.world_size > 1:
            # Registered once training runs, so it runs before the interpreter tears down
            # torch (atexit handlers run last-registered first).
            atexit.unregister(_close_process_group)
            atexit.register(_close_process_group)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.active:
            return
        requests = self.requests
        save, stop = requests.save, requests.stop
        if args.world_size > 1:
            # Under torchrun every rank must save at the same step (the save has collectives
            # in it): a request any rank got counts for all, at this same step end.
            save, stop = any_rank([save, stop])
        if save or stop:
            requests.save = False
            control.should_save = True
        if stop:
            control.should_training_stop = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        # The Trainer's printer runs after the callbacks passed to Trainer(callbacks=...):
        # the printed dict then says which step it is.
        if self.active and logs is not None and "loss" in logs:
            logs.setdefault("step", state.global_step)
