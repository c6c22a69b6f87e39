"""Handing memory that a flood of control clients held back to the system (glibc)."""

from __future__ import annotations

import gc

from trainwarden.libc import malloc_trim, set_mmap_threshold

LARGE_ALLOCATION = 128 << 10


def map_large_allocations() -> None:
    """Have every allocation over LARGE_ALLOCATION mapped on its own, so it goes back to
    the system when freed. glibc raises its mmap threshold each time such a block is
    freed, after which request lines, replies and read buffers of a flood of clients
    land in the heap and keep RSS at the flood's peak long after the clients left."""
    set_mmap_threshold(LARGE_ALLOCATION)


def release_memory() -> None:
    """Free what closed connections held and give the heap's free pages back to the
    system. A connection's stream objects refer to each other, so only the cycle
    collector frees them (with their buffers), and it may not run for a long while."""
    gc.collect()
    malloc_trim()
