"""Producers of commands in process: a closed loop (each sends its next command once the
previous one returned) or paced (together, a given rate), counted over one window.

Every in-process scenario (the writer, the hub, workers, PostgreSQL, accounts, the replica)
drives its writer with these, so "commands/s" and "p50" mean the same thing in each:

    load = await produce(send, producers=200, warmup=0.4, seconds=1.6,
                         opened=window_start, closed=window_end)
    load.rate, load.p50_ms, load.p99_ms, load.errors

`send(k, i)` sends producer k's i-th command and returns once it is answered. The window opens
after the warm-up; `load.cost` is this process's CPU and memory over it, and `opened` and
`closed` run at its edges (snapshots of counters, another process's CPU), so what they measure
is the window the rate was counted over.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from .proc import Figures, Window
from .stats import percentile

Send = Callable[[int, int], Awaitable[object]]


@dataclass
class Load:
    done: int = 0  # answered in the window
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds from send to answer
    errors: Counter[str] = field(default_factory=Counter)
    cost: Figures | None = None  # this process's CPU and memory over the window

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds else float("nan")

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies, 50) * 1e3

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies, 99) * 1e3


class _Phase:
    running = True
    measuring = False


async def produce(send: Send, producers: int, *, warmup: float, seconds: float, rate: float = 0.0,
                  opened: Callable[[], object] | None = None, closed: Callable[[], object] | None = None,
                  seed: int = 0) -> Load:
    """Run `producers` producers, closed loop (rate 0) or paced at `rate` commands/s in all."""
    phase, load = _Phase(), Load()
    loop = asyncio.get_running_loop()
    interval = producers / rate if rate > 0 else 0.0

    async def producer(k: int) -> None:
        rng = random.Random(seed * 100_003 + k)
        pc, i = time.perf_counter, 0
        due = loop.time() + rng.uniform(0, interval)
        while phase.running:
            if interval:
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -1.0:  # far behind (a stall): no burst to catch up
                    due = loop.time()
                due += interval * rng.uniform(0.5, 1.5)
            measuring = phase.measuring
            t0 = pc()
            try:
                await send(k, i)
            except Exception as exc:  # noqa: BLE001 - counted and reported beside the figure
                if measuring:
                    load.errors[f"{type(exc).__name__}: {str(exc)[:60]}"] += 1
            else:
                if measuring and phase.measuring:
                    load.done += 1
                    load.latencies.append(pc() - t0)
            i += 1

    tasks = [asyncio.create_task(producer(k)) for k in range(producers)]
    try:
        await asyncio.sleep(warmup)
        if opened is not None:
            opened()
        window, t0 = Window.open(), time.perf_counter()
        phase.measuring = True
        await asyncio.sleep(seconds)
        phase.measuring = False
        load.seconds, load.cost = time.perf_counter() - t0, window.close()
        if closed is not None:
            closed()
    finally:
        phase.running = False
        await asyncio.gather(*tasks)
    return load
