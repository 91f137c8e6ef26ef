"""How much of the machine a timed block got (the demo's note that a busy machine measured it)."""

from __future__ import annotations

import os
import time

from specli.costs import STARVED
from specli.settings import usable_cores


class CpuShare:
    """How much of the machine this process got while a timed block ran: its CPU time over the wall
    time its threads could have used. Well below 1, other programs were taking the cores, and the
    rates measured meanwhile say more about them than about speculation."""

    def __enter__(self) -> CpuShare:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def busy(self, threads: int) -> str | None:
        """A note when the process got less than costs.STARVED of its threads' time (the share below
        which the cost model distrusts a decode too), else None."""
        usable = max(1, min(threads, usable_cores()))
        share = self.cpu / (self.wall * usable) if self.wall > 0 else 1.0
        if share >= STARVED:
            return None
        load = ""
        if hasattr(os, "getloadavg"):
            load = f", load average {os.getloadavg()[0]:.1f} on {usable_cores()} cores"
        return (f"the machine was busy ({share:.0%} of {usable} cores' time went to specli{load}): these "
                "rates are not what it does when quiet; run it again when it is")
