"""What specli asks of the machine it runs on: its CPU (cpuinfo, AMX), the threads to decode with, and
the memory a new allocation can get. Read from the operating system, never from llama.cpp."""

from __future__ import annotations

import functools

from specli.settings import usable_cores


@functools.cache
def cpuinfo(field: str) -> str | None:
    """The first CPU's `field` in /proc/cpuinfo (Linux), None where there is none; read once per field."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() == field:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_has_amx() -> bool:
    """Whether the CPU advertises Intel AMX (Linux). llama.cpp's AMX matrix kernels, which repacked
    weights use for batches of more than one token, crash there on some Xeons (llama.cpp issue
    #20824; seen on the 2-core Xeon machines this project is developed on: every verify batch of a
    K-quant or Q8_0 model, and llama-bench's prompt test), so specli does not repack on such CPUs."""
    return "amx_int8" in (cpuinfo("flags") or "").split()


def default_threads() -> int:
    """Threads for decoding: the cores this process may use, halved on big machines whose logical
    cores are mostly SMT siblings (oversubscribing physical cores slows llama.cpp down)."""
    n = usable_cores()
    return n if n <= 4 else max(4, n // 2)


def available_memory() -> int | None:
    """Bytes of memory a new allocation can get without swapping (Linux MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
