"""The memory a new allocation can still get on a device: the system's available memory and this process's cgroup
limit on the CPU, the free memory and the caching allocator's unused blocks on a GPU."""

from __future__ import annotations

import os
from pathlib import Path

import torch

NO_LIMIT = 1 << 60  # a cgroup limit at or above this is "max"
MEMINFO = Path("/proc/meminfo")  # MemAvailable: what the kernel can give new allocations
CGROUP_ROOT = Path("/sys/fs/cgroup")  # where the cgroup hierarchies are mounted
SELF_CGROUP = Path("/proc/self/cgroup")  # this process's cgroups, one "id:controllers:path" line per hierarchy


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2 without a limit) reads as None


def _inactive_file(stat: Path) -> int:
    """Reclaimable page cache in a cgroup's memory.stat, which its usage figure includes."""
    try:
        fields = dict(line.split(" ", 1) for line in stat.read_text().splitlines() if " " in line)
        # v1's usage counts the cgroups below too, as its total_ figure does
        return int(fields.get("total_inactive_file", fields.get("inactive_file", 0)))
    except (OSError, ValueError):
        return 0


def _cgroup_free() -> int | None:
    """Room left under the memory limit of this process's cgroup (v2 `memory.max`, or v1 `memory.limit_in_bytes`),
    the reclaimable page cache counted as free; None when no limit is set."""
    try:
        groups = SELF_CGROUP.read_text().splitlines()
    except OSError:
        groups = []
    own = {"v2": "", "v1": ""}
    for line in groups:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            own["v2"] = path.lstrip("/")
        elif "memory" in controllers.split(","):
            own["v1"] = path.lstrip("/")
    root = CGROUP_ROOT
    candidates = [
        (root / own["v2"], "memory.max", "memory.current"),
        (root, "memory.max", "memory.current"),
        (root / "memory" / own["v1"], "memory.limit_in_bytes", "memory.usage_in_bytes"),
        (root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
    ]
    free = []
    for directory, limit_file, usage_file in candidates:
        limit, usage = _read_int(directory / limit_file), _read_int(directory / usage_file)
        if limit is not None and usage is not None and limit < NO_LIMIT:
            free.append(max(limit - usage + _inactive_file(directory / "memory.stat"), 0))
    return min(free) if free else None


def _mem_available() -> int | None:
    """The kernel's estimate of memory available to new allocations (/proc/meminfo MemAvailable), or the free
    physical pages where there is no /proc."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes a new allocation can still get on `device`, or None when that cannot be read.

    CPU: the system's MemAvailable, lowered to the room under this process's cgroup limit when there is one.
    CUDA: the device's free memory (`torch.cuda.mem_get_info`) plus what torch's caching allocator holds unused.
    """
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    figures = [f for f in (_mem_available(), _cgroup_free()) if f is not None]
    return min(figures) if figures else None
