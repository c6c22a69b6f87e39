"""Other runs' histories read for clients (`history_of`, `related_runs`): in a thread of
their own, bounded, cached, never in the way of the daemon's own run."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from trainwarden.supervisor.store import runseries
from trainwarden.supervisor.store.digest import Signature, signature_of

OTHERS_WAITING = 4
"""Reads of other runs' histories at once (one being read, the rest waiting); more are
refused `busy`."""
OTHERS_CACHED = 4
"""Other runs whose parsed histories are kept (while their loss files are unchanged)."""
T = TypeVar("T")


class OtherRuns:
    """Reading other runs' histories for clients (history_of, related_runs), bounded so
    that no number of them delays this run's own history or its supervision: one thread
    of their own, at most OTHERS_WAITING queries at once (more are refused `busy`), and
    the newest OTHERS_CACHED runs' parsed series kept while their own loss files are
    unchanged, so asking again costs no parse (a branch's inherited part is read again
    with its own file's next change)."""

    def __init__(self) -> None:
        self.thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="history-of"
        )
        self.waiting = 0
        self.cache: collections.OrderedDict[tuple[Path, Signature], runseries.RunSeries] = (
            collections.OrderedDict()
        )

    async def run(self, loop: asyncio.AbstractEventLoop, work: Callable[[], T]) -> T:
        if self.waiting >= OTHERS_WAITING:
            raise runseries.OthersBusy(
                f"{self.waiting} reads of other runs are already waiting; ask again shortly"
            )
        self.waiting += 1
        try:
            return await loop.run_in_executor(self.thread, work)
        finally:
            self.waiting -= 1

    def series(self, path: Path) -> runseries.RunSeries:
        """In the thread: the run's series, parsed again only when its loss file changed."""
        try:
            key = (path, signature_of([path / ".loss.json"]))
        except OSError:
            key = (path, ())
        found = self.cache.get(key)
        if found is None:
            found = runseries.read_run_series(path)
            self.cache[key] = found
            while len(self.cache) > OTHERS_CACHED:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(key)
        return found

    def close(self) -> None:
        self.thread.shutdown(wait=False, cancel_futures=True)
