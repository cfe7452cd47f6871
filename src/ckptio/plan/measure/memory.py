"""What this host's kernel says about its memory: the dirty page-cache threshold past which it writes back, and the
memory it can hand out. Read from ``/proc``; None where it cannot be read (not Linux), never a guess."""

from __future__ import annotations

import os


def dirty_background_bytes(vm_dir: str = "/proc/sys/vm", meminfo: str = "/proc/meminfo") -> float | None:
    """Dirty page-cache bytes past which this host's kernel starts writing back (the whole host's: divide by the
    ranks that write at once). ``vm.dirty_background_bytes`` when set, else ``vm.dirty_background_ratio`` % of
    the memory that can hold dirty pages, taken as ``MemAvailable``. None where it cannot be read (not Linux)."""
    try:
        with open(os.path.join(vm_dir, "dirty_background_bytes"), encoding="ascii") as f:
            fixed = int(f.read())
        if fixed > 0:
            return float(fixed)
        with open(os.path.join(vm_dir, "dirty_background_ratio"), encoding="ascii") as f:
            ratio = int(f.read())
    except (OSError, ValueError):
        return None
    available = memory_available(meminfo)
    return None if available is None else ratio / 100.0 * available


def memory_available(meminfo: str = "/proc/meminfo") -> float | None:
    """``MemAvailable`` in bytes: what the kernel can hand out without swapping. None where it cannot be read."""
    try:
        with open(meminfo, encoding="ascii") as f:
            return float(next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")))
    except (OSError, ValueError, StopIteration):
        return None
