"""The fan-out in process: real SQLite, writer, hub and encoders; stream bodies read as uvicorn would."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import brotli
import htpy as h
import pytest
import sqlalchemy as sa
import zstandard

from fastapi_lith import Command, Db, Lith, Tx
from fastapi_lith.engine.encoders import BrotliEncoder, Encoder, GzipEncoder, ZstdEncoder
from fastapi_lith.engine.fanout import INLINE_BELOW, INLINE_PER_PASS, Fanout
from fastapi_lith.engine.frames import Frame
from fastapi_lith.engine.streams import Stream
from fastapi_lith.testing import Tabs

counter = sa.table("counter", sa.column("id"), sa.column("count"))
ADD = counter.update().where(counter.c.id == 1).values(count=counter.c.count + 1)
COUNT = sa.select(counter.c.count).where(counter.c.id == 1)
FILLER = [f"card {i}: some text that repeats from frame to frame" for i in range(100)]


class Add(Command):
    def apply(self, tx: Tx) -> None:
        tx.execute(ADD)
        tx.touch("board")


def make_lith(tmp_path: Path, *, pad: int = 1) -> Lith:
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_init.sql").write_text(
        "CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL);"
        "INSERT INTO counter VALUES (1, 0);"
    )
    lith = Lith(tmp_path / "app.db", migrations=tmp_path / "migrations")

    @lith.view("board", topics={"board"})
    def board(db: Db) -> h.Element:
        count = db.scalar(COUNT)
        return h.main(id="board")[h.p(id="count")[f"count={count};"], [h.p[t] for t in FILLER * pad]]

    return lith


class Reader:
    """Drives one body as sse-starlette does and decodes what it yields."""

    def __init__(self, chunks: AsyncIterator[bytes], encoding: str) -> None:
        self.chunks = chunks
        self.encoding = encoding
        self.text = ""
        self.closed = False
        self._zstd = zstandard.ZstdDecompressor().decompressobj()
        self._br = brotli.Decompressor()
        self._gzip = zlib.decompressobj(31)

    def feed(self, chunk: bytes) -> None:
        if self.encoding == "zstd":
            while chunk:
                self.text += self._zstd.decompress(chunk).decode()
                if not self._zstd.eof:
                    break
                self.closed = True
                chunk = self._zstd.unused_data
                self._zstd = zstandard.ZstdDecompressor().decompressobj()
        elif self.encoding == "br":
            out = self._br.process(chunk)
            while more := self._br.process(b""):
                out += more
            self.text += out.decode()
            self.closed = self._br.is_finished()
        else:
            self.text += self._gzip.decompress(chunk).decode()
            self.closed = self._gzip.eof

    async def one(self) -> None:
        self.feed(await anext(self.chunks))

    async def run(self) -> None:
        async for chunk in self.chunks:
            self.feed(chunk)

    @property
    def count(self) -> int:
        found = re.findall(r"count=(\d+);", self.text)
        return int(found[-1]) if found else -1


async def until(condition: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


async def test_a_stalled_stream_among_200_costs_no_encode_work(tmp_path: Path) -> None:
    lith = make_lith(tmp_path, pad=2)  # over INLINE_BELOW: every board goes to the workers
    fanout = Fanout(workers=2)
    try:
        async with Tabs(lith) as tabs:
            streams = [Stream(f"t{i}") for i in range(200)]
            for stream in streams:
                await lith.hub.open(stream, ["board"])
            readers = [Reader(s.body(ZstdEncoder(), fanout=fanout), "zstd") for s in streams]
            stalled = readers[0]
            await stalled.one()  # its first frame, then it stops reading
            tasks = [asyncio.create_task(r.run()) for r in readers[1:]]
            await until(lambda: all(r.count == 0 for r in readers[1:]), "first frames")
            hops = fanout.hops
            for n in range(1, 11):
                await tabs.do(Add())
                assert await tabs.tick() == 1  # the stalled stream does not hold the board back
                await until(lambda n=n: all(r.count == n for r in readers[1:]), f"frame {n}")
            assert streams[0].encodes == 1  # only the first frame: nothing since it stalled
            assert streams[0].skipped == 9 and streams[0].holds("board")
            assert [s.encodes for s in streams[1:]] == [11] * 199
            assert fanout.encodes == 1 + 199 * 11 and fanout.inline == 0
            # One hop per worker per tick: the 199 streams of a tick go in two batches, not 199.
            assert fanout.hops - hops == 10 * 2
            # When it reads again it gets the newest board in one encode, not the ten it missed.
            await stalled.one()
            await until(lambda: stalled.count == 10, "the stalled stream catches up")
            assert streams[0].encodes == 2
            await stalled.chunks.aclose()  # type: ignore[attr-defined]
        await asyncio.wait_for(asyncio.gather(*tasks), 10)  # shutdown ended every body
        assert all(r.closed for r in readers[1:])
    finally:
        fanout.close()


class ThreadNoting(ZstdEncoder):
    """A real zstd encoder that notes which thread compresses."""

    threads: set[str] = set()

    def encode(self, *events: bytes) -> bytes:
        self.threads.add(threading.current_thread().name)
        return super().encode(*events)


async def test_encodes_run_beside_the_loop_and_small_writes_on_it(tmp_path: Path) -> None:
    lith = make_lith(tmp_path, pad=2)
    async with Tabs(lith) as tabs:
        stream = Stream("t")
        await lith.hub.open(stream, ["board"])
        reader = Reader(stream.body(ThreadNoting()), "zstd")
        task = asyncio.create_task(reader.run())
        await tabs.do(Add())
        await tabs.tick()
        await until(lambda: reader.count == 1, "the second frame")
        assert ThreadNoting.threads and all(n.startswith("lith-fanout-") for n in ThreadNoting.threads)
        ThreadNoting.threads.clear()
        frame = lith.hub.instances["board"].frame
        assert frame is not None
        lith.hub.push("t", type(frame)("error", "<p id=error>rejected</p>"))  # 100-odd bytes
        await until(lambda: "rejected" in reader.text, "the small frame")
        assert ThreadNoting.threads == {threading.current_thread().name}
    await asyncio.wait_for(task, 10)
    assert reader.closed


@pytest.mark.parametrize("size", [100, 20_000], ids=["on the loop", "on a worker"])
async def test_a_frame_that_cannot_be_encoded_ends_its_body_with_the_error(size: int) -> None:
    """An encode error reaches its stream's body, wherever it was encoded: never a body that waits."""
    fanout = Fanout(workers=1)
    stream = Stream("t")
    stream.offer(Frame("board", "\ud800" * size))  # a lone surrogate: no UTF-8 for it
    try:
        async with asyncio.timeout(10):  # a body that would wait forever
            with pytest.raises(UnicodeEncodeError):
                async for _ in stream.body(ZstdEncoder(), fanout=fanout):
                    pass
    finally:
        fanout.close()
    assert stream.ended and not stream.encoding
    assert (fanout.inline, fanout.encodes) == ((1, 1) if size < INLINE_BELOW else (0, 1))


async def test_shutdown_closes_every_body_while_frames_are_in_flight(tmp_path: Path) -> None:
    lith = make_lith(tmp_path, pad=20)  # a large board, so encodes are in flight at shutdown
    kinds: list[tuple[str, type[Encoder]]] = [
        ("zstd", ZstdEncoder), ("br", BrotliEncoder), ("gzip", GzipEncoder)
    ]
    encoders = [(name, kind()) for _ in range(10) for name, kind in kinds]
    async with Tabs(lith) as tabs:
        streams = [Stream(f"t{i}") for i in range(len(encoders))]
        for stream in streams:
            await lith.hub.open(stream, ["board"])
        readers = [Reader(s.body(e), name) for s, (name, e) in zip(streams, encoders, strict=True)]
        tasks = [asyncio.create_task(r.run()) for r in readers]
        for _ in range(3):
            await tabs.do(Add())
            await tabs.tick()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert all(r.closed for r in readers), [r.encoding for r in readers if not r.closed]
    assert all(r.count >= 0 for r in readers)
    assert all(not s.encoding for s in streams)


async def test_a_brotli_frame_that_outgrows_the_window_ends_its_body_cleanly(tmp_path: Path) -> None:
    lith = make_lith(tmp_path)
    async with Tabs(lith):
        stream = Stream("t")
        await lith.hub.open(stream, ["board"])
        encoder = BrotliEncoder()
        reader = Reader(stream.body(encoder), "br")
        await reader.one()
        assert encoder.lgwin == 16
        frame = lith.hub.instances["board"].frame
        assert frame is not None
        big = type(frame)("board", frame.html * 40)
        lith.hub.push("t", big)
        await asyncio.wait_for(reader.run(), 10)  # the body ends after sending it
        assert encoder.needs_restart and reader.closed and stream.ended
        assert reader.text.count("datastar-patch-elements") == 2


class Outlet:
    """Not a `Stream`: only what the fan-out's `Encodable` asks for, so it can reach nothing else."""

    def __init__(self, frames: list[Frame]) -> None:
        self.frames: list[Frame] | None = frames
        self.out: list[bytes | BaseException] = []
        self.done = asyncio.Event()

    def start_encode(self) -> tuple[Outlet, Encoder, list[Frame]] | None:
        frames, self.frames = self.frames, None
        return None if frames is None else (self, GzipEncoder(), frames)

    def encoded(self, out: bytes | BaseException) -> None:
        self.out.append(out)
        self.done.set()


@pytest.mark.parametrize("size", [10, INLINE_BELOW], ids=["on the loop", "on a worker"])
async def test_the_fanout_needs_of_a_stream_only_start_encode_and_encoded(size: int) -> None:
    fanout = Fanout(1)
    outlet = Outlet([Frame("k", "x" * size)])
    try:
        fanout.request(outlet)
        fanout.request(outlet)  # asked twice in one pass: the second finds nothing to encode
        await asyncio.wait_for(outlet.done.wait(), 10)
    finally:
        fanout.close()
    [out] = outlet.out
    assert (fanout.inline, fanout.hops) == ((1, 0) if size < INLINE_BELOW else (0, 1))
    assert isinstance(out, bytes) and b"x" * size in zlib.decompressobj(31).decompress(out)


async def test_a_fanout_starts_its_size_in_workers_and_none_keeps_the_process_alive() -> None:
    """`workers` threads exactly, started by the first encode too big for the loop; daemons, since
    the process's shared fan-out is never closed and a live worker would hold up its exit."""
    before = set(threading.enumerate())  # the shared fan-out of earlier tests may run beside
    fanout = Fanout(3)
    outlet = Outlet([Frame("k", "x" * INLINE_BELOW)])
    try:
        fanout.request(outlet)
        await asyncio.wait_for(outlet.done.wait(), 10)
        workers = set(threading.enumerate()) - before
        assert sorted(t.name for t in workers) == ["lith-fanout-0", "lith-fanout-1", "lith-fanout-2"]
        assert all(t.daemon for t in workers)
    finally:
        fanout.close()
    assert not workers & set(threading.enumerate())


def test_a_fanout_without_a_size_takes_one_worker_a_core_up_to_four() -> None:
    """Sized to the cores, which the process's streams share: more threads than cores only switch."""
    assert Fanout().size == min(4, os.cpu_count() or 1)
    assert Fanout(7).size == 7


async def test_one_pass_encodes_every_stream_it_was_asked_for_and_counts_each() -> None:
    """A stream with nothing to encode is skipped, not the end of the pass; the small ones are
    counted one by one; and two large ones, far fewer than a worker takes, make one hop."""
    fanout = Fanout(4)
    empty = Outlet([])
    empty.frames = None
    small = [Outlet([Frame("k", f"small {i}")]) for i in range(2)]
    large = [Outlet([Frame("k", f"{i}" * INLINE_BELOW)]) for i in range(2)]
    try:
        for outlet in (empty, *small, *large):
            fanout.request(outlet)
        await asyncio.wait_for(asyncio.gather(*(o.done.wait() for o in (*small, *large))), 10)
    finally:
        fanout.close()
    assert (fanout.inline, fanout.encodes, fanout.hops) == (2, 4, 1)
    assert empty.out == [] and all(len(o.out) == 1 for o in (*small, *large))


async def test_many_small_writes_are_encoded_a_pass_at_a_time_with_the_loop_s_other_work_between() -> None:
    """A shared view's change for thousands of tabs: the loop's other callbacks (a POST's next
    step, the first streams' sends) run between passes, not after every tab's encode; and every
    stream is still encoded once, in the order asked, none on a worker."""
    fanout = Fanout(1)
    outlets = [Outlet([Frame("k", f"small {i}")]) for i in range(2 * INLINE_PER_PASS + 5)]
    done_at_each_turn: list[int] = []

    def turn() -> None:
        done_at_each_turn.append(sum(1 for o in outlets if o.out))
        if len(done_at_each_turn) < 4:
            asyncio.get_running_loop().call_soon(turn)

    order: list[int] = []
    for i, outlet in enumerate(outlets):
        outlet.encoded = lambda out, i=i, o=outlet: (order.append(i), Outlet.encoded(o, out))  # type: ignore[method-assign]
        fanout.request(outlet)
    loop = asyncio.get_running_loop()
    loop.call_soon(turn)
    raised: list[dict[str, object]] = []  # what a pass's callback raised into the loop
    loop.set_exception_handler(lambda _loop, context: raised.append(context))
    try:
        await asyncio.wait_for(asyncio.gather(*(o.done.wait() for o in outlets)), 10)
    finally:
        loop.set_exception_handler(None)
        fanout.close()
    assert raised == []
    assert done_at_each_turn[:3] == [INLINE_PER_PASS, 2 * INLINE_PER_PASS, len(outlets)]
    assert order == list(range(len(outlets)))
    assert (fanout.inline, fanout.encodes, fanout.hops) == (len(outlets), len(outlets), 0)
