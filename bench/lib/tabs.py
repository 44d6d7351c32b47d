"""Thousands of real tabs from one process: each an SSE stream, reconnected as Datastar 1.0 does.

A `Herd` opens N tabs on an app's stream route (HTTP/1.1, `Accept-Encoding` zstd, br or gzip;
client.py de-chunks and decodes each body as it arrives and splits its events). Each tab reads
a marker out of its frames (a number in the HTML, the counter's value) and keeps the moment each
value first reached it, so a figure is measured per tab, never multiplied:

    herd = Herd(port, "/lith/stream?views=counter,outcome/{tab}&tab={tab}", COUNTER, encoding="zstd")
    await herd.open(1000)                       # returns once every tab has its first frame
    herd.watch(value)                           # count the tabs showing `value` or later
    status, answered = await herd.post("/add", {"n": 1})
    await herd.until(lambda h: h.current >= 1000, 60)
    latencies = herd.latencies(value, answered)  # per tab, seconds after the 204

A tab whose stream ends comes back as Datastar v1.0.1's `@get(url, {retry: 'always',
retryMaxCount: Infinity})` does (its fetch, read in starhtml 0.7.0's datastar-core.js):

- SSE's `retry:` field sets both its retry interval and the interval it resets to (default
  1,000 ms);
- a body that ends cleanly: wait the interval, reconnect;
- an answer other than 200 (a 5xx): wait the interval, reconnect, the interval unchanged;
- a failed fetch (refused, reset): wait the interval, then double it, to at most 30 s;
- a 200: the interval goes back to the one it resets to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import resource
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from . import client

# Datastar v1.0.1's fetch defaults (retryInterval, retryScaler, retryMaxWait).
RETRY_INTERVAL_MS = 1000
RETRY_SCALER = 2
RETRY_MAX_WAIT_MS = 30_000

# The counter example's shared view, `<p id="counter" class="count">7</p>`.
COUNTER = re.compile(rb'class="count">(\d+)<')
# bench/lib/tabsapp.py's per-tab view, `<p id="mine">herd7 sees 12</p>`.
MINE = re.compile(rb'id="mine">\S+ sees (\d+)<')
RETRY = re.compile(rb"^retry: *(\d+)$", re.M)

Condition = Callable[["Herd"], bool]
KEEPALIVE_REUSE = 2.0  # seconds a POST connection may sit idle and still be used again


def raise_file_limit() -> tuple[int, int]:
    """Raise this process's open-file limit to its hard limit: (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def listen_limits() -> dict[str, int]:
    """The kernel's caps on a listen queue: somaxconn bounds uvicorn's `--backlog`."""
    out = {}
    for name, path in (("somaxconn", "/proc/sys/net/core/somaxconn"),
                       ("tcp_max_syn_backlog", "/proc/sys/net/ipv4/tcp_max_syn_backlog")):
        try:
            out[name] = int(Path(path).read_text())
        except (OSError, ValueError):
            continue
    return out


def listen_overflows() -> int:
    """Connects the kernel dropped since boot because a listen queue was full (TcpExt
    ListenOverflows, machine-wide): a dropped SYN is not refused, the client sends it again
    1, 2, 4... s later, so a full queue shows as a tail, not as errors."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return -1
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True)).get("ListenOverflows", -1))
    return -1


class Tab:
    """One tab's stream across its reconnects, and what reached it when."""

    __slots__ = ("herd", "id", "interval", "resets_to", "retries", "arrivals", "latest", "first_frame_at",
                 "connected_at", "connects", "refused", "failed", "statuses", "stream", "task", "asleep", "mark")

    def __init__(self, herd: Herd, tab_id: str) -> None:
        self.herd = herd
        self.id = tab_id
        self.interval = self.resets_to = RETRY_INTERVAL_MS
        self.retries: list[int] = []  # every `retry:` value its streams sent
        self.arrivals: dict[int, float] = {}  # marker -> when it first reached this tab
        self.latest = -1
        self.first_frame_at = float("nan")
        self.connected_at: list[float] = []  # each 200, when its headers came
        self.connects = 0
        self.refused: list[float] = []  # each refused connect, when
        self.failed: dict[str, int] = {}  # other failed fetches, by what happened
        self.statuses: dict[int, int] = {}  # answers other than 200, by status
        self.stream: client.SseStream | None = None
        self.task: asyncio.Task[None] | None = None
        self.asleep = False  # its zstd stream ended a frame since its last one: compressor freed
        self.mark = 0  # zstd frames its stream had ended at its last frame

    def on_bytes(self, stream: client.SseStream) -> None:
        if not self.asleep and stream.decode.frames_ended > self.mark:
            self.asleep = True
            self.herd.asleep += 1
            self.herd.check()

    def on_event(self, stream: client.SseStream, event: bytes, at: float) -> None:
        if event.startswith(b":"):
            return
        if b"retry:" in event:
            for found in RETRY.finditer(event):
                self.interval = self.resets_to = int(found.group(1))
                self.retries.append(self.interval)
        shown = self.herd.marker.search(event)
        if shown is None:
            return
        self.herd.frames += 1
        self.mark = stream.decode.frames_ended
        if self.asleep:
            self.asleep = False
            self.herd.asleep -= 1
        value = int(shown.group(1))
        self.arrivals.setdefault(value, at)
        if self.first_frame_at != self.first_frame_at:
            self.first_frame_at = at
            self.herd.first_frames += 1
            self.herd.check()
        if value > self.latest:
            before, self.latest = self.latest, value
            self.herd.moved(before, value)

    def reached_at(self, value: int) -> float:
        """When this tab first showed `value` or a later one (a slow tab skips frames); nan if never."""
        times = [at for v, at in self.arrivals.items() if v >= value]
        return min(times) if times else float("nan")

    async def run(self) -> None:
        """Datastar's fetch loop with `retry: 'always'`, until the herd closes."""
        herd = self.herd
        loop = asyncio.get_running_loop()
        while not herd.closing:
            ended: asyncio.Future[None] = loop.create_future()
            # Only a tab's first connect is paced: the reconnects of a storm come as a browser's
            # do, each on its own timer, whatever the server's listen queue makes of them.
            pace = herd.connecting if self.connects == 0 else contextlib.nullcontext()
            try:
                async with pace:
                    stream = await client.open_stream(herd.port, herd.path.replace("{tab}", self.id), herd.encoding,
                                                      self.on_event, self.id)
                stream.on_end = lambda _, ended=ended: ended.done() or ended.set_result(None)  # this one's
                stream.on_bytes = self.on_bytes
                self.stream = stream
                self.mark = 0
                await stream.opened
            except OSError as exc:  # refused, reset: the fetch rejects
                if isinstance(exc, ConnectionRefusedError):
                    self.refused.append(time.perf_counter())
                else:
                    self.fail("closed before its headers" if self.stream is not None and self.stream.status is None
                              else type(exc).__name__)
                await self.back_off()
                continue
            except RuntimeError:  # an answer other than 200 (client.py fails the stream)
                status = self.stream.status if self.stream is not None else None
                if status is None:
                    await self.back_off()
                    continue
                self.statuses[status] = self.statuses.get(status, 0) + 1
                await asyncio.sleep(self.interval / 1000)
                continue
            self.connects += 1
            self.connected_at.append(time.perf_counter())
            self.interval = self.resets_to
            herd.connected += 1
            herd.check()
            await ended
            herd.connected -= 1
            if self.asleep:
                self.asleep = False
                herd.asleep -= 1
            if herd.closing:
                return
            if stream.finished:  # a clean end: the deploy's way
                await asyncio.sleep(self.interval / 1000)
            else:  # the body broke off: the fetch rejects
                self.fail("body broke off")
                await self.back_off()

    def fail(self, what: str) -> None:
        self.failed[what] = self.failed.get(what, 0) + 1

    async def back_off(self) -> None:
        await asyncio.sleep(self.interval / 1000)
        self.interval = min(self.interval * RETRY_SCALER, RETRY_MAX_WAIT_MS)


class Herd:
    """N tabs on one server; conditions to wait on (every tab connected, every tab current)."""

    def __init__(self, port: int, path: str, marker: re.Pattern[bytes], *, encoding: str = "zstd",
                 connecting_at_once: int = 1024) -> None:
        self.port, self.path, self.marker, self.encoding = port, path, marker, encoding
        self.tabs: list[Tab] = []
        self.closing = False
        # First connects in flight at once (not requests: a request waits for its answer
        # outside), so that opening N tabs is not one burst of N SYNs at a listen queue.
        self.connecting = asyncio.Semaphore(connecting_at_once)
        self.connected = self.first_frames = self.frames = self.asleep = 0
        self.target = -1  # the marker `current` counts tabs at
        self.current = 0  # tabs whose latest is at least `target`
        self.waits: list[tuple[Condition, asyncio.Future[None]]] = []
        self.poster: client.Poster | None = None
        self.posted: list[tuple[float, float]] = []  # (sent, 204) of each post

    # -- conditions --------------------------------------------------------------------------

    def moved(self, before: int, value: int) -> None:
        if before < self.target <= value:
            self.current += 1
            self.check()

    def check(self) -> None:
        for item in list(self.waits):
            condition, done = item
            if not done.done() and condition(self):
                done.set_result(None)
                self.waits.remove(item)

    async def until(self, condition: Condition, timeout: float) -> bool:
        """Wait until `condition(herd)` holds; False if it did not within `timeout` seconds."""
        if condition(self):
            return True
        done = asyncio.get_running_loop().create_future()
        self.waits.append((condition, done))
        try:
            await asyncio.wait_for(done, timeout)
            return True
        except TimeoutError:
            return False

    def watch(self, value: int) -> None:
        """Count the tabs that show `value` or later, from now on (`current`)."""
        self.target = value
        self.current = sum(1 for t in self.tabs if t.latest >= value)

    # -- opening, posting, closing -------------------------------------------------------------

    async def open(self, count: int, *, timeout: float = 120.0, prefix: str = "herd") -> float:
        """Start `count` more tabs; returns once each has its first frame (seconds it took)."""
        started = time.perf_counter()
        first = len(self.tabs)
        for i in range(first, first + count):
            tab = Tab(self, f"{prefix}{i}")
            tab.task = asyncio.create_task(tab.run())
            self.tabs.append(tab)
        total = len(self.tabs)
        if not await self.until(lambda h: h.first_frames >= total, timeout):
            raise TimeoutError(f"{total - self.first_frames} of {total} tabs had no first frame in {timeout:.0f} s")
        return time.perf_counter() - started

    async def post(self, path: str, fields: dict[str, object]) -> tuple[int, float]:
        """A command from one more tab (its own connection, kept open): (status, when its answer
        came). Its `sent` is in `posted` too."""
        body = json.dumps({"tab": "poster", "op": 0, **fields}).encode()
        # uvicorn closes a keep-alive connection idle for 5 s: one idle longer is not reused.
        last = self.posted[-1][1] if self.posted else 0.0
        if self.poster is not None and time.perf_counter() - last > KEEPALIVE_REUSE:
            self.poster.close()
            self.poster = None
        if self.poster is None or self.poster.transport is None or self.poster.transport.is_closing():
            self.poster = await client.Poster.connect(self.port)
        sent = time.perf_counter()
        status = await asyncio.wait_for(self.poster.post(path, body), 60)
        answered = time.perf_counter()
        self.posted.append((sent, answered))
        return status, answered

    async def close(self) -> None:
        self.closing = True
        for tab in self.tabs:
            if tab.stream is not None:
                tab.stream.close()
            if tab.task is not None:
                tab.task.cancel()
        await asyncio.gather(*(t.task for t in self.tabs if t.task is not None), return_exceptions=True)
        if self.poster is not None:
            self.poster.close()

    # -- what happened -----------------------------------------------------------------------

    def latencies(self, value: int, since: float, tabs: Iterable[Tab] | None = None) -> list[float]:
        """Seconds from `since` until each tab showed `value` or later (tabs that never did
        are left out: count them with `missed`)."""
        out = [t.reached_at(value) - since for t in (self.tabs if tabs is None else tabs)]
        return [x for x in out if x == x]

    def missed(self, value: int) -> int:
        return sum(1 for t in self.tabs if t.latest < value)

    def refused(self, after: float = 0.0) -> int:
        """Connects refused after `after` (perf_counter seconds)."""
        return sum(1 for t in self.tabs for at in t.refused if at >= after)

    def failures(self) -> dict[str, int]:
        """Fetches that failed other than by a refusal or an answer, by what happened."""
        out: dict[str, int] = {}
        for tab in self.tabs:
            for what, n in tab.failed.items():
                out[what] = out.get(what, 0) + n
        return out

    def statuses(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for tab in self.tabs:
            for status, n in tab.statuses.items():
                out[status] = out.get(status, 0) + n
        return out


