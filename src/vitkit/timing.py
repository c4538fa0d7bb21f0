"""The one timing primitive: warm-up, repeats alternated between the contenders, median, spread, paired ratio.

Alternating (A B C, B C A, C A B, ...) spreads any slow-down from other
processes or frequency changes over all contenders instead of one. The
spread reported is the inter-quartile range relative to the median. Everything that times in vitkit uses
:func:`alternate`: the kernel planner (:mod:`vitkit.models.planner`), ``vitkit bench``, ``vitkit serve
--engine auto``, the reproduction's speed claim and ``benchmarks/cpu_kernels.py``; a choice between
contenders is made by :func:`decide`, the one noise rule (a margin on the median paired ratio).
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .errors import InputError


@dataclass
class Stats:
    """Seconds per call over the timed repeats."""

    times: List[float] = field(default_factory=list)
    first_call: Optional[float] = None  # the first warm-up call (includes compilation, if any)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def worst(self) -> float:
        return max(self.times)

    @property
    def spread(self) -> float:
        """Inter-quartile range / median (0.05 = the middle half of the repeats lies within 5%)."""
        if len(self.times) < 2:
            return 0.0
        q = statistics.quantiles(self.times, n=4, method="inclusive")
        return (q[2] - q[0]) / self.median

    def to_dict(self) -> dict:
        return {"median_s": self.median, "best_s": self.best, "worst_s": self.worst,
                "spread": round(self.spread, 4), "repeats": len(self.times), "times_s": list(self.times),
                "first_call_s": self.first_call}


def synchronizer(device: str) -> Callable[[], None]:
    """A function that waits for the device's queued work (a no-op on CPU)."""
    if str(device).startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def time_call(fn: Callable[[], object], sync: Callable[[], None] = lambda: None) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _repeat(fn: Callable[[], object], n: int) -> None:
    """Call ``fn`` n times, dropping each result before the next call: results kept alive (as a list would)
    make every call allocate fresh memory, whose page faults were timed with the product (a bf16 GEMM of
    ViT-B/16's qkv timed 20 at a time ran at half its rate that way)."""
    for _ in range(n):
        fn()


class Timed(dict):
    """:func:`alternate`'s :class:`Stats` by case name; ``cpu_wait``: the share of the timed rounds' thread-time
    the threads spent waiting for a CPU that other work held (None where the kernel does not say)."""
    cpu_wait: Optional[float] = None

    def ratio(self, base: str, other: str) -> float:
        """The median over rounds of ``base``'s time / ``other``'s in the same round (> 1: ``other`` faster)."""
        return statistics.median([a / b for a, b in zip(self[base].times, self[other].times)])


def alternate(cases: Dict[str, Callable[[], object]], *, warmup: int = 1, repeats: int = 5,
              sync: Callable[[], None] = lambda: None, min_seconds: float = 0.0,
              on_repeat: Optional[Callable[[str, float], None]] = None) -> Timed:
    """Time every case ``repeats`` times, rotating the order each round, after ``warmup`` untimed calls each.

    ``min_seconds``: a repeat of a fast case calls it several times until at
    least this long has passed and records the mean (keeps timer noise small).
    ``on_repeat(name, seconds)`` is called after each timed repeat (progress).
    """
    if repeats < 1:
        raise InputError(f"repeats must be at least 1, got {repeats}")
    names = list(cases)
    inner = {n: 1 for n in names}
    out = Timed({n: Stats() for n in names})
    for n in names:
        for w in range(max(warmup, 0)):
            t = time_call(cases[n], sync)
            if w == 0:
                out[n].first_call = t
        if warmup > 0 and min_seconds > 0 and t < min_seconds:
            inner[n] = min(1000, max(1, int(min_seconds / max(t, 1e-6))))
    waited0, start = run_delay_s(), time.perf_counter()
    for order in rotations(names, repeats):
        for n in order:
            fn, reps = cases[n], inner[n]
            if reps == 1:
                t = time_call(fn, sync)
            else:
                t = time_call(lambda: _repeat(fn, reps), sync) / reps
            out[n].times.append(t)
            if on_repeat:
                on_repeat(n, t)
    waited1, wall = run_delay_s(), time.perf_counter() - start
    if waited0 is not None and waited1 is not None and wall > 0:
        out.cpu_wait = round(max(0.0, waited1 - waited0) / (wall * max(1, torch.get_num_threads())), 4)
    return out


def rotations(names: Sequence[str], repeats: int) -> List[List[str]]:
    """The order in which :func:`alternate` runs the cases, round by round."""
    names = list(names)
    return [names[r % len(names):] + names[:r % len(names)] for r in range(repeats)]



# --- the noise rule -----------------------------------------------------------------------------------
MARGIN = 1.05  # a contender replaces the baseline when its median paired speed-up reaches this
ROUNDS = 7  # alternating rounds behind every choice
MAX_CPU_WAIT = 0.05  # a timing whose threads waited for a CPU > 5% of their time is used but not kept


def decide(timed: Timed, base: str, margin: float = MARGIN) -> str:
    """The contender whose median paired speed-up over ``base`` is largest, if it reaches ``margin``; else
    ``base``: the one rule behind every timed choice."""
    others = {n: timed.ratio(base, n) for n in timed if n != base}
    best = max(others, key=others.get, default=base)
    return best if best != base and others[best] >= margin else base


def run_delay_s() -> Optional[float]:
    """Seconds this process's threads have spent runnable but waiting for a CPU (Linux schedstat), or None
    where the kernel does not say."""
    total = 0
    try:
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/schedstat") as f:
                    total += int(f.read().split()[1])
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def quiet(timed: Timed) -> bool:
    """Whether a timing can be kept for later processes: the 1-minute load within the cores and its threads
    seldom kept from a CPU (a load average lags, and work that starts or stops during a timing can fake a
    gain: an encoder block timed beside CI showed 1.57x where the quiet machine gave 1.01x)."""
    try:
        busy = os.getloadavg()[0] > (os.cpu_count() or 1) + 0.5
    except (AttributeError, OSError):
        busy = False
    return not busy and (timed.cpu_wait is None or timed.cpu_wait <= MAX_CPU_WAIT)
