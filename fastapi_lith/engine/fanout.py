"""The fan-out: frames in, encoded bytes per stream out, compressed beside the event loop.

zstd, brotli and zlib release the GIL while they compress, so the streams' encodes run on
worker threads while the loop serves requests. Every stream offered a frame in one pass of
the loop (a tick's fan-out, or the streams that finished a write) goes to the workers in one
hop, and the results come back in one: the loop pays two thread hops per batch, not per stream.

A stream is encoded for only once its previous bytes are written: one that stalls keeps just
the newest frame of each view and costs no encode work until it drains. A small write (a
tab's own outcome, an error) is encoded on the loop at once: a thread hop costs more than it.
Many small writes at once (a shared view's change for thousands of tabs) are encoded a few
dozen a pass, so the loop reads requests between them. A stream whose body waits writes its
bytes as they come back (`Stream.encoded`), in the pass: no wake-up of its response's task.
"""

from __future__ import annotations

import asyncio
import collections
import os
import queue
import threading
import time
from typing import Protocol

from .encoders import Encoder
from .frames import Frame, html_size

__all__ = ["Encodable", "Fanout", "shared"]

# Below this many streams per worker a second hop costs more than the overlap gains.
_PER_WORKER = 16
# Writes smaller than this are encoded on the loop: a round trip to a worker costs more loop
# CPU than compressing a few kilobytes (bench/send.py).
INLINE_BELOW = 4096
# Small writes encoded on the loop in one pass; the rest wait for the next. On worker threads
# they cost more (each one's encode is too short to be worth giving up the GIL), and all in one
# pass keep a POST waiting until every tab's encode is done.
INLINE_PER_PASS = 32


class Encodable(Protocol):
    """What the fan-out needs of a stream, and all it may touch (`Stream` is the one in use)."""

    def start_encode(self) -> tuple[Encodable, Encoder, list[Frame]] | None:
        """Its pending frames for one encode, or None: nothing to do now. The stream and its
        encoder come with them, in the shape the workers' batches hold."""

    def encoded(self, out: bytes | BaseException) -> None:
        """The encode's bytes (or its error), handed back on the loop."""


_Job = tuple[Encodable, Encoder, list[Frame]]
_Result = tuple[Encodable, bytes | BaseException]


class Fanout:
    """Worker threads that encode streams' pending frames, one hop per batch each way."""

    def __init__(self, workers: int | None = None) -> None:
        self.size = workers or max(1, min(4, os.cpu_count() or 1))
        self.hops = 0  # batches handed to the workers
        self.encodes = 0  # stream writes encoded, here or on the loop
        self.inline = 0  # of which small enough to encode on the loop
        self._queue: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, list[_Job]] | None]
        self._queue = queue.SimpleQueue()
        self._waiting: dict[asyncio.AbstractEventLoop, collections.deque[Encodable]] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def request(self, stream: Encodable) -> None:
        """Encode `stream`'s pending frames soon: with every other request of this loop pass."""
        loop = asyncio.get_running_loop()
        waiting = self._waiting.get(loop)
        if waiting is None:
            waiting = self._waiting[loop] = collections.deque()
            loop.call_soon(self._flush, loop)
        waiting.append(stream)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        waiting = self._waiting[loop]
        jobs: list[_Job] = []
        inline = 0
        while waiting and inline < INLINE_PER_PASS:
            job = waiting.popleft().start_encode()
            if job is None:
                continue
            if html_size(job[2]) >= INLINE_BELOW:
                jobs.append(job)
                continue
            try:
                out: bytes | BaseException = job[1].encode_frames(job[2])
            except BaseException as exc:  # noqa: BLE001 - raised in that stream's body
                out = exc
            inline += 1
            job[0].encoded(out)
        self.encodes += inline
        self.inline += inline
        if waiting:  # the rest after what this pass let wait: requests read, the first sends
            loop.call_soon(self._flush, loop)
            # Nothing else in a broadcast gives up the GIL (a small write's encode is a cached
            # frame, the sockets' writes keep it): a thread that waits for it, the writer
            # committing a request's command, would wait out the switch interval each time.
            time.sleep(0)
        else:
            del self._waiting[loop]
        if not jobs:
            return
        if not self._threads:
            self._start()
        parts = max(1, min(self.size, len(jobs) // _PER_WORKER))
        step = -(-len(jobs) // parts)
        for start in range(0, len(jobs), step):
            self.hops += 1
            self._queue.put((loop, jobs[start : start + step]))

    def _start(self) -> None:
        with self._lock:
            while len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._work, name=f"lith-fanout-{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, jobs = item
            results: list[_Result] = []
            for stream, encoder, frames in jobs:
                try:  # a frame's event is formatted here, off the loop, by its first stream
                    results.append((stream, encoder.encode_frames(frames)))
                except BaseException as exc:  # noqa: BLE001 - raised in that stream's body
                    results.append((stream, exc))
            try:
                loop.call_soon_threadsafe(self._deliver, results)
            except RuntimeError:  # the loop closed meanwhile: nobody waits for these bytes
                pass

    def _deliver(self, results: list[_Result]) -> None:
        self.encodes += len(results)
        for stream, out in results:
            stream.encoded(out)

    def close(self) -> None:
        """End the threads once the queued batches are done."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join()


_shared: Fanout | None = None


def shared() -> Fanout:
    """The process's fan-out: its threads start with the first encode and are sized to the
    cores, which every app and stream of the process share."""
    global _shared
    if _shared is None:
        _shared = Fanout()
    return _shared
