"""The kanban board over real HTTP: 200 tabs watching a 200-card board while 200 people move cards.

The example app (`examples/kanban`) runs as its own uvicorn process (uvloop and httptools when
installed, as `uvicorn[standard]` brings them; else asyncio and h11) on a board seeded by `python -m examples.kanban.seed DB --cards 200`
(~146 KB per board event). This process is the load, on a minimal HTTP/1.1 client over raw
asyncio protocols (the lightest client there is in Python: it shares the cores with the server,
so its own CPU is measured and printed too).

  streams    one connection per tab: `GET /lith/stream?views=board/1,outcome/{tab}&tab={tab}`
             with `Accept-Encoding: zstd` (one run) or `br` (another); each body is de-chunked,
             decompressed with the matching decoder (zstd: several frames; brotli: drained
             with `process(b"")`) and split into SSE events. A stream the server ends is
             reopened at once, as Datastar's `retry: 'always'` would, and counted.
  producers  producer i acts as tab i: `POST /cards/move` with the JSON the page sends
             (`{tab, op, card_id, lane_id, position}`, `Datastar-Request: true`,
             `Sec-Fetch-Site: same-origin`, `Content-Type: application/json`) on its own
             keep-alive connection; every op id is unique in the run. A producer sends its next
             move once the previous POST returned *and* its tab's stream showed that op
             (`data-signals:done="<op>"` in the tab's `outcome/{tab}` view), paced so that all of
             them together offer `--rate` moves/s (800, as lith's hub benchmark; 0 = unpaced).
             The achieved rate is what the server sustains.

Measured over a window after a warm-up: moves/s, frames (SSE events) received per second,
compressed body bytes per frame, server CPU in cores (/proc/<pid>/stat utime+stime over the
window, every thread) and how long its threads sat runnable waiting for a CPU (schedstat: the
shared machine's noise), server peak and final RSS (VmHWM, VmRSS), the client's own CPU, other
processes' CPU, and post-to-frame latency: from writing the POST to decoding the event on the
acting tab's stream that carries its op. Runs: zstd and br at `--rate`, and zstd at
`--light-rate` (40/s) to see latency below saturation. Beside them, the ceiling: the writer
alone, in process (a subprocess of this script), on a copy of the same board, the same MoveCard
commands from 200 producers through `await writer.do(cmd)`.

    python bench/kanban.py                 # 3 runs of 30 s + the writer ceiling: ~2.5 min
    python bench/kanban.py --quick         # 10 s windows: ~1 min
    python bench/kanban.py --quick --encodings zstd --light-rate 0 --no-ceiling --workers 1,2
    python bench/kanban.py --profile       # and a zstd run under py-spy (10 s), summarised
    python bench/kanban.py --what-if card-cache,move-sql --quick   # suggested fixes, patched in
    python bench/kanban.py --quick --old ../old-checkout --rounds 2  # old and new servers take turns
    python bench/kanban.py --quick --backends sqlite,postgres --workers 2 --rounds 2 --no-ceiling
                                           # SQLite and PostgreSQL take turns (A B A B)
    python bench/kanban.py --encodings '' --light-rate 0 --backends sqlite,postgres --ceiling-batches 512,64,16
                                           # the writer alone on each, at each batch size
    python bench/kanban.py --summarize RUN.json   # re-summarise a --profile --json run

`--backends sqlite,postgres` serves the same board from PostgreSQL as well: a throwaway cluster
of Debian's `postgresql` (tests/support/pgcluster.py) with its default, durable settings over a unix
socket, or the server `LITH_PG_URL` names. The board is seeded once by `python -m
examples.kanban.seed URL --cards N` (the example's PostgreSQL migrations) and each run gets a
fresh copy (`CREATE DATABASE ... TEMPLATE`), as each SQLite run gets a copy of the seeded file.
The cluster's CPU (the postmaster and its backends) is measured over the window beside the
server's, since on SQLite the database's work is inside the server's processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import brotli  # noqa: E402
import zstandard  # noqa: E402

from conditions import (  # noqa: E402
    DEFAULT_PACKAGES, cpu_jiffies, load_average, one_line, percentile, print_conditions, wait_for_quiet,
)

try:
    import uvloop
except ImportError:  # pragma: no cover - optional
    uvloop = None
try:
    import httptools  # noqa: F401
except ImportError:
    HTTP_IMPL = "h11"
else:
    HTTP_IMPL = "httptools"

PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
BOARD_ID = 1

# lith (Go) over HTTP, 200 tabs on the 200-card board (DESIGN.md), and the goals of the issue.
LITH = {"zstd": {"cores": 2.7, "bytes": 3162}, "br": {"cores": 5.2, "bytes": 1010}}
LITH_FRAMES_S = 3960  # lith's hub: 19.8 ticks/s x 200 streams at 800 commands/s
GO_KANBAN_P95_MS = 98.0  # kanban in Go, 200 tabs
GOAL_CORES_ZSTD = 1.5
GOAL_P95_MS = 100.0

EVENT_END = b"\n\n"
DONE = b'data-signals:done="'
BOARD_HEAD = b'<div id="board"'
OUTCOME_HEAD = b'<div id="outcome"'


# -- the server process ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seed(path: Path | str, cards: int, py: str = PY, root: Path = ROOT) -> None:
    """`python -m examples.kanban.seed DB --cards N`, as a user would, with a checkout's own
    code: each version migrates its database to its own schema."""
    subprocess.run([py, "-m", "examples.kanban.seed", str(path), "--cards", str(cards)],
                   cwd=root, check=True, capture_output=True)


def board_layout(path: Path | str) -> tuple[list[int], list[int]]:
    """The card ids and lane ids of board 1 (read-only), from a SQLite file or a PostgreSQL URL."""
    lanes_sql = "SELECT id FROM lane WHERE board_id = ? ORDER BY position"
    cards_sql = "SELECT card.id FROM card JOIN lane ON lane.id = card.lane_id WHERE lane.board_id = ? ORDER BY card.id"
    if isinstance(path, str) and "://" in path:
        import psycopg

        with psycopg.connect("postgresql://" + path.split("://", 1)[1]) as conn:
            lanes = [r[0] for r in conn.execute(lanes_sql.replace("?", "%s"), (BOARD_ID,))]
            cards = [r[0] for r in conn.execute(cards_sql.replace("?", "%s"), (BOARD_ID,))]
        return cards, lanes
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        lanes = [r[0] for r in conn.execute(lanes_sql, (BOARD_ID,))]
        cards = [r[0] for r in conn.execute(cards_sql, (BOARD_ID,))]
    finally:
        conn.close()
    return cards, lanes


class PgBoards:
    """PostgreSQL for `--backends postgres`: a server, the seeded board in a template database,
    and a fresh copy of it per run."""

    def __init__(self, cards: int) -> None:
        from tests.support import pgcluster

        url = os.environ.get("LITH_PG_URL")
        self.server = pgcluster.Existing(url) if url else pgcluster.Cluster(durable=True)
        self.described = ("LITH_PG_URL" if url else
                          "a throwaway cluster (Debian's tools), default durable settings: fsync on, "
                          "synchronous_commit on; unix socket")
        self.template = self.server.create_database("kanban_seeded")
        seed(self.template, cards)  # type: ignore[arg-type]
        self._made: list[str] = []

    def version(self) -> str:
        import psycopg

        with psycopg.connect(self.server.dsn()) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return f"PostgreSQL {row[0] if row else '?'}"

    def postmaster(self) -> int | None:
        """The cluster's postmaster (its backends are its children), when it runs here."""
        data = getattr(self.server, "data", None)
        try:
            return int((data / "postmaster.pid").read_text().split()[0]) if data else None
        except (OSError, ValueError, IndexError):
            return None

    def fresh(self, prefix: str) -> str:
        """A copy of the seeded database; returns its URL."""
        import secrets
        from urllib.parse import urlsplit, urlunsplit

        import psycopg

        name = f"{prefix}_{secrets.token_hex(4)}"
        template = urlsplit(self.template).path.lstrip("/")
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        self._made.append(name)
        return urlunsplit(urlsplit(self.template)._replace(path="/" + name))

    def drop(self, url: str) -> None:
        from urllib.parse import urlsplit

        import psycopg

        name = urlsplit(url).path.lstrip("/")
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        self.server.stop()


def proc_tree(pid: int) -> list[int]:
    """The process and its children: `uvicorn --workers N` is a supervisor and N workers."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return [pid, *children]


def proc_cpu(pid: int) -> float:
    """Seconds of CPU (user + system, every thread) the process and its children have used."""
    total = 0.0
    for p in proc_tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)
    return total


def proc_threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread id of the process and its children (thread ids are unique)."""
    out = {}
    for task in (t for p in proc_tree(pid) for t in Path(f"/proc/{p}/task").iterdir()):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[task.name] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def proc_runqueue_wait(pid: int) -> float:
    """Seconds the threads of the process and its children spent runnable but waiting for a CPU
    (schedstat), summed."""
    total = 0
    for task in (t for p in proc_tree(pid) for t in Path(f"/proc/{p}/task").iterdir()):
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def proc_mem(pid: int) -> dict[str, float]:
    """VmHWM and VmRSS in MiB, summed over the process and its children."""
    out = {"VmHWM": 0.0, "VmRSS": 0.0}
    for p in proc_tree(pid):
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":", 1)
                out[key] += int(value.split()[0]) / 1024
    return out


def proc_loop(pid: int) -> str:
    """Which event loop the server really runs: uvloop's extension mapped into it, or asyncio."""
    try:
        maps = Path(f"/proc/{proc_tree(pid)[-1]}/maps").read_text()  # a worker, if any
    except OSError:
        return "unknown"
    return "uvloop" if "uvloop/loop." in maps else "asyncio"


# What-ifs: the same server with one suggested fix patched in at startup (examples/ and
# fastapi_lith/ stay untouched), to measure what the fix would buy. Diagnostics, not defaults.
WHAT_IF = {
    # The card fragment keyed without the card's index: the index only fills the move buttons'
    # values, which board.js could read from the DOM instead. Same HTML size (the buttons keep
    # a number), but a move no longer changes the cache key of every card below it.
    "card-cache": """
import examples.kanban.views as _v
_orig = _v.card_item.__wrapped__
@_v.fragment()
def _card(row, first, last, left, right):
    return _orig(row, 0 if first else 1, last, left, right)
_v.card_item = lambda row, index, last, left, right: _card(row, index == 0, last, left, right)
""",
    # MoveCard in three statements instead of one UPDATE per card of the target lane: shift the
    # cards at and below the slot by one, then place the card (positions may keep gaps).
    "move-sql": """
from examples.kanban import commands as _c
def _apply(self, tx):
    card = _c.find_card(tx, self.card_id)
    lane = _c.find_lane(tx, self.lane_id)
    if lane["board_id"] != card["board_id"]:
        raise _c.CommandError("That lane is on another board.")
    at = tx.first("SELECT position FROM card WHERE lane_id = ? AND id != ? ORDER BY position, id "
                  "LIMIT 1 OFFSET ?", (self.lane_id, self.card_id, self.position))
    if at is None:
        slot = tx.scalar("SELECT coalesce(max(position), -1) + 1 FROM card WHERE lane_id = ? AND id != ?",
                         (self.lane_id, self.card_id))
    else:
        slot = at[0]
        tx.execute("UPDATE card SET position = position + 1 WHERE lane_id = ? AND position >= ? AND id != ?",
                   (self.lane_id, slot, self.card_id))
    tx.execute("UPDATE card SET lane_id = ?, position = ? WHERE id = ?", (self.lane_id, slot, self.card_id))
    self.landed(tx, card["board_id"], f"Moved \u201c{card['title']}\u201d to {lane['title']}.")
_c.MoveCard.apply = _apply
""",
}


@dataclass(frozen=True)
class Tree:
    """A checkout whose server runs: this one ("new") or `--old DIR` with its own .venv."""

    name: str
    root: Path
    py: str
    http: str

    @classmethod
    def old(cls, root: Path) -> Tree:
        py = str(root / ".venv" / "bin" / "python")
        has = subprocess.run([py, "-c", "import httptools"], capture_output=True).returncode == 0
        return cls("old", root, py, "httptools" if has else "h11")


class Server:
    """`python -m uvicorn examples.kanban.app:app` on a free port, `KANBAN_DB` = a seeded copy
    (a SQLite file or a PostgreSQL URL)."""

    def __init__(self, db: Path | str, loop: str, log: Path, switch_interval: float = 0.0,
                 what_if: tuple[str, ...] = (), tree: Tree | None = None, workers: int = 1,
                 backend: str = "sqlite", db_pid: int | None = None) -> None:
        self.db, self.loop, self.log_path = db, loop, log
        self.backend = backend
        self.db_pid = db_pid  # PostgreSQL's postmaster: its CPU is the database's
        self.tree = tree or Tree("new", ROOT, PY, HTTP_IMPL)
        self.workers = workers
        self.switch_interval = switch_interval
        self.what_if = what_if
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ, KANBAN_DB=str(self.db), PYTHONUNBUFFERED="1")
        argv = ["examples.kanban.app:app", "--host", "127.0.0.1",
                "--port", str(self.port), "--no-access-log", "--loop", self.loop, "--http", self.tree.http]
        if self.workers > 1:  # processes on one database file, sharing commits through the feed
            argv += ["--workers", str(self.workers)]
        cmd = [self.tree.py, "-m", "uvicorn", *argv]
        if self.switch_interval or self.what_if:  # diagnostics: the same server, patched at startup
            code = "import runpy, sys\n"
            if self.switch_interval:
                code += f"sys.setswitchinterval({self.switch_interval!r})\n"
            code += "".join(WHAT_IF[w] for w in self.what_if)
            code += f"sys.argv = ['uvicorn', *{argv!r}]\nrunpy.run_module('uvicorn', run_name='__main__')\n"
            cmd = [self.tree.py, "-c", code]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=self.tree.root, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(f"GET /boards/{BOARD_ID} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                    if s.recv(64).startswith(b"HTTP/1.1 200"):
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not come up:\n{self.tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # our own child, by its pid
                self.proc.wait()
        self._log.close()


# -- the client: a minimal HTTP/1.1 on asyncio protocols -------------------------------------------


class Waiters:
    """Per tab, the op its producer waits to see on the tab's stream."""

    def __init__(self) -> None:
        self.by_tab: dict[str, tuple[int, asyncio.Future[float]]] = {}
        self.last: dict[str, list[int]] = defaultdict(list)  # the ops each tab's streams showed

    def seen(self, tab: str, op: int, at: float) -> None:
        self.last[tab].append(op)
        waiting = self.by_tab.get(tab)
        if waiting is not None and op >= waiting[0] and not waiting[1].done():
            waiting[1].set_result(at)


class StreamClient(asyncio.Protocol):
    """One tab's SSE stream: de-chunk, decompress, split events, report the ops it shows."""

    def __init__(self, tab: str, encoding: str, waiters: Waiters) -> None:
        self.tab, self.encoding, self.waiters = tab, encoding, waiters
        self.buf = bytearray()
        self.text = b""  # decoded bytes after the last complete event
        self.headers_done = False
        self.need: int | None = None  # size of the chunk being read
        self.status = 0
        self.content_encoding = ""
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.first_board: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.on_end: Any = None  # called once when the body or the connection ends
        self.ended_at = 0.0  # when the body ended (its last chunk), if it did
        self.error: str | None = None
        # counters
        self.wire = 0  # every byte read from the socket
        self.body = 0  # compressed body bytes (chunk payloads)
        self.chunks = 0
        self.decoded = 0
        self.events = 0
        self.board = 0
        self.outcome = 0
        self.keepalives = 0
        if encoding == "zstd":
            self._dctx = zstandard.ZstdDecompressor()
            self._z = self._dctx.decompressobj(write_size=1 << 19)
        elif encoding == "br":
            self._br = brotli.Decompressor()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(f"stream {self.tab} closed before its headers"))
        self._ended()

    def _ended(self) -> None:
        if self.on_end is not None:
            on_end, self.on_end = self.on_end, None
            on_end(self)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.wire += len(data)
        buf = self.buf
        buf += data
        pos = 0
        if not self.headers_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).decode("latin-1").split("\r\n")
            self.status = int(head[0].split()[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
            self.content_encoding = headers.get("content-encoding", "")
            self.headers_done = True
            pos = end + 4
            if self.status != 200 or headers.get("transfer-encoding", "").lower() != "chunked":
                self._fail(f"status {self.status}, headers {headers}")
                return
            if self.content_encoding != self.encoding:
                self._fail(f"asked for {self.encoding}, got Content-Encoding {self.content_encoding!r}")
                return
            self.opened.set_result(None)
        n = len(buf)
        try:
            while True:
                if self.need is None:
                    eol = buf.find(b"\r\n", pos)
                    if eol < 0:
                        break
                    size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
                    if size == 0:  # the body ended: the server ended the stream
                        pos = n
                        self.closed = True
                        self.ended_at = time.perf_counter()
                        self._ended()
                        break
                    pos = eol + 2
                    self.need = size
                if n - pos < self.need + 2:
                    break
                payload = bytes(buf[pos:pos + self.need])
                pos += self.need + 2
                self.need = None
                self.body += len(payload)
                self.chunks += 1
                self._events(self._decode(payload), now)
        except Exception as exc:  # noqa: BLE001 - a corrupt body is a finding: reported
            self._fail(f"{type(exc).__name__}: {exc}")
            return
        del buf[:pos]

    def _fail(self, why: str) -> None:
        self.error = why
        if not self.opened.done():
            self.opened.set_exception(RuntimeError(f"stream {self.tab}: {why}"))
        self.transport.close()

    def _decode(self, payload: bytes) -> bytes:
        if self.encoding == "zstd":
            out = self._z.decompress(payload)
            while self._z.eof:  # a hibernated stream starts a new zstd frame in the same body
                rest = self._z.unused_data
                self._z = self._dctx.decompressobj(write_size=1 << 19)
                if not rest:
                    break
                out += self._z.decompress(rest)
            return out
        if self.encoding == "br":
            out = self._br.process(payload)
            while True:  # process() can hold back part of a flushed block: drain it
                more = self._br.process(b"")
                if not more:
                    return out
                out += more
        return payload

    def _events(self, out: bytes, now: float) -> None:
        if not out:
            return
        self.decoded += len(out)
        data = self.text + out if self.text else out
        start = 0
        while True:
            end = data.find(EVENT_END, start)
            if end < 0:
                break
            head = data[start:start + 96]
            if head.startswith(b":"):
                self.keepalives += 1
            else:
                self.events += 1
                if BOARD_HEAD in head:
                    self.board += 1
                    if not self.first_board.done():
                        self.first_board.set_result(None)
                elif OUTCOME_HEAD in head:
                    self.outcome += 1
                    i = data.find(DONE, start, end)
                    if i >= 0:
                        i += len(DONE)
                        j = data.index(b'"', i)
                        self.waiters.seen(self.tab, int(data[i:j]), now)
            start = end + 2
        self.text = data[start:]


class PostClient(asyncio.Protocol):
    """One keep-alive connection for one producer's POSTs; answers the status code."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.fut: asyncio.Future[int] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(ConnectionError("POST connection closed"))

    def send(self, request: bytes) -> asyncio.Future[int]:
        self.fut = asyncio.get_running_loop().create_future()
        self.transport.write(request)  # type: ignore[attr-defined]
        return self.fut

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buf[:end]).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        length = 0
        for line in head[1:]:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key == "content-length":
                length = int(value)
            elif key == "transfer-encoding":  # not sent for these routes; fail loudly if it is
                raise RuntimeError("chunked POST response")
        if len(buf) < end + 4 + length:
            return
        del buf[:end + 4 + length]
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(status)


# -- one run -------------------------------------------------------------------------------------


class Run:
    """One encoding's run against one fresh server."""

    def __init__(self, args: argparse.Namespace, encoding: str, rate: float, server: Server, cards: list[int],
                 lanes: list[int], profile_out: Path | None = None) -> None:
        self.args, self.encoding, self.rate, self.server = args, encoding, rate, server
        self.cards, self.lanes = cards, lanes
        self.profile_out = profile_out
        self.waiters = Waiters()
        self.streams: list[StreamClient] = []  # every connection opened, reconnections included
        self.closing = False
        self.reconnects: list[tuple[float, str, int, str | None]] = []  # (when, tab, events, error)
        self._background: set[asyncio.Task[Any]] = set()
        self.measuring = False
        self.running = True
        self.latencies: list[float] = []  # post to frame, seconds
        self.post_latencies: list[float] = []  # post to its 204
        self.moves = 0  # sent in the window and seen on the stream
        self.statuses: Counter[int] = Counter()
        self.lost = 0  # sent in the window, no frame within the timeout
        self.lost_tabs: set[str] = set()
        self.lost_detail: list[Any] = []
        self.t0 = 0.0
        self.ops = iter(range(1, 1 << 62))

    async def connect(self, tab: str) -> StreamClient:
        """Open one tab's stream; when it ends, reconnect at once, as Datastar's `retry: 'always'`."""
        loop = asyncio.get_running_loop()
        request = (
            f"GET /lith/stream?views=board/{BOARD_ID},outcome/{tab}&tab={tab} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{self.server.port}\r\nAccept: text/event-stream\r\n"
            f"Accept-Encoding: {self.encoding}\r\nCache-Control: no-cache\r\n"
            f"Datastar-Request: true\r\nSec-Fetch-Site: same-origin\r\n\r\n"
        ).encode()
        _, proto = await loop.create_connection(
            lambda: StreamClient(tab, self.encoding, self.waiters), "127.0.0.1", self.server.port)
        self.streams.append(proto)
        proto.on_end = self._ended
        proto.transport.write(request)  # type: ignore[attr-defined]
        return proto

    def _ended(self, proto: StreamClient) -> None:
        if self.closing:
            return
        self.reconnects.append((time.perf_counter(), proto.tab, proto.events, proto.error))
        task = asyncio.get_running_loop().create_task(self.connect(proto.tab))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def open_streams(self, tag: str) -> list[str]:
        """Open every tab's stream; returns the tabs, in order (producer i acts as tab i)."""
        gate = asyncio.Semaphore(32)
        tabs = [f"{tag}-{i:03d}" for i in range(self.args.tabs)]

        async def open_one(tab: str) -> None:
            async with gate:
                proto = await self.connect(tab)
                await asyncio.wait_for(proto.opened, 30)
                await asyncio.wait_for(proto.first_board, 30)

        await asyncio.gather(*(open_one(tab) for tab in tabs))
        return tabs

    def totals(self) -> dict[str, int]:
        keys = ("wire", "body", "chunks", "decoded", "events", "board", "outcome", "keepalives")
        return {k: sum(getattr(s, k) for s in self.streams) for k in keys}

    async def producer(self, i: int, tab: str, conn: PostClient, start: float) -> None:
        loop = asyncio.get_running_loop()
        rng = random.Random(i * 7919 + 17)
        host = f"127.0.0.1:{self.server.port}"
        period = self.args.tabs / self.rate if self.rate > 0 else 0.0
        next_at = start + period * i / self.args.tabs
        pc = time.perf_counter
        cards, lanes = self.cards, self.lanes
        while self.running:
            now = loop.time()
            if next_at > now:
                await asyncio.sleep(next_at - now)
                if not self.running:
                    break
            op = next(self.ops)
            body = json.dumps({"tab": tab, "op": op, "card_id": rng.choice(cards),
                               "lane_id": rng.choice(lanes), "position": rng.randrange(0, 60)},
                              separators=(",", ":")).encode()
            request = (
                f"POST /cards/move HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Datastar-Request: true\r\nSec-Fetch-Site: same-origin\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            seen: asyncio.Future[float] = loop.create_future()
            self.waiters.by_tab[tab] = (op, seen)
            in_window = self.measuring
            t0 = pc()
            status = await conn.send(request)
            t1 = pc()
            try:
                at = await asyncio.wait_for(seen, self.args.frame_timeout)
            except TimeoutError:
                if in_window:
                    self.lost += 1
                    self.lost_tabs.add(tab)
                    self.lost_detail.append((tab, op, self.waiters.last[tab][-5:], round(t0 - self.t0, 2)))
                at = None
            if in_window:
                self.statuses[status] += 1
                self.post_latencies.append(t1 - t0)
                if at is not None:
                    self.moves += 1
                    self.latencies.append(at - t0)
            next_at += period
            now = loop.time()
            if next_at < now:  # behind: no burst to catch up, the next one goes now
                next_at = now

    async def run(self) -> dict[str, Any]:
        args, pid = self.args, self.server.pid
        loop = asyncio.get_running_loop()
        rss_base = proc_mem(pid)["VmRSS"]
        tabs = await self.open_streams(f"{self.encoding}{os.getpid() % 1000}")
        rss_streams = proc_mem(pid)["VmRSS"]
        conns = []
        for _ in range(args.tabs):
            _, proto = await loop.create_connection(PostClient, "127.0.0.1", self.server.port)
            conns.append(proto)
        start = loop.time() + 0.05
        tasks = [asyncio.create_task(self.producer(i, tab, c, start)) for i, (tab, c) in enumerate(zip(tabs, conns))]
        await asyncio.sleep(args.warmup)
        # the window
        spy = None
        if self.profile_out is not None:
            spy = subprocess.Popen(
                [str(Path(PY).parent / "py-spy"), "record", "-p", str(pid), "-r", "100", "-f", "raw",
                 "-d", str(int(args.window)), "--threads", "-o", str(self.profile_out),
                 *(["--nonblocking"] if args.spy_nonblocking else []),
                 *(["--subprocesses"] if self.server.workers > 1 else [])],  # uvicorn's workers
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        thr0 = proc_threads_cpu(pid) if spy is not None else {}
        db_pid = self.server.db_pid
        tot0, srv0, own0, mach0 = self.totals(), proc_cpu(pid), os.times(), cpu_jiffies()
        dbc0 = proc_cpu(db_pid) if db_pid else 0.0
        rq0 = proc_runqueue_wait(pid)
        t0 = self.t0 = time.perf_counter()
        self.measuring = True
        await asyncio.sleep(args.window)
        self.measuring = False
        t1 = time.perf_counter()
        tot1, srv1, own1, mach1 = self.totals(), proc_cpu(pid), os.times(), cpu_jiffies()
        dbc1 = proc_cpu(db_pid) if db_pid else 0.0
        rq1 = proc_runqueue_wait(pid)
        mem = proc_mem(pid)
        wall = t1 - t0
        thr1 = proc_threads_cpu(pid) if spy is not None else {}
        thread_cpu = {tid: thr1[tid] - thr0.get(tid, 0.0) for tid in thr1}
        # let the window's last moves land, then stop
        self.running = False
        await asyncio.wait(tasks, timeout=args.frame_timeout + 2)
        for t in tasks:
            t.cancel()
        self.closing = True
        errors = [s.error for s in self.streams if s.error]
        ended_at = sorted(when - t0 for when, *_ in self.reconnects)
        in_window = sum(1 for when, *_ in self.reconnects if t0 <= when <= t1)
        for proto in [*self.streams, *conns]:
            proto.transport.close()  # type: ignore[attr-defined]
        spy_err = ""
        if spy is not None:
            _, err = await loop.run_in_executor(None, spy.communicate)
            spy_err = err.decode(errors="replace")[-500:] if spy.returncode else ""
        d = {k: tot1[k] - tot0[k] for k in tot0}
        server_cpu = srv1 - srv0
        db_cpu = dbc1 - dbc0  # 0 on SQLite: the database works inside the server's processes
        client_cpu = (own1.user + own1.system) - (own0.user + own0.system)
        machine = ((mach1[0] - mach0[0]) / CLK_TCK) if mach0 and mach1 else float("nan")
        return {
            "encoding": self.encoding,
            "label": (f"{self.encoding} @{self.rate:g}/s" if self.rate else f"{self.encoding} unpaced")
            + (f", {self.server.workers} processes" if self.server.workers > 1 else ""),
            "tabs": args.tabs,
            "rate_offered": self.rate,
            "workers": self.server.workers,
            "window_s": wall,
            "moves": self.moves,
            "moves_s": self.moves / wall,
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "lost": self.lost,
            "lost_tabs": sorted(self.lost_tabs)[:10],
            "lost_detail": self.lost_detail[:10],
            "lost_tabs_reconnected": len(self.lost_tabs & {tab for _, tab, _, _ in self.reconnects}),
            "frames": d["events"],
            "frames_s": d["events"] / wall,
            "board_frames_s": d["board"] / wall,
            "board_frames_per_tab_s": d["board"] / wall / args.tabs,
            "outcome_frames_s": d["outcome"] / wall,
            "keepalives": d["keepalives"],
            "chunks_s": d["chunks"] / wall,
            "body_bytes": d["body"],
            "wire_bytes": d["wire"],
            "bytes_per_frame": d["body"] / d["events"] if d["events"] else float("nan"),
            "bytes_per_chunk": d["body"] / d["chunks"] if d["chunks"] else float("nan"),
            # what one move costs on the wire of one tab: frames carry more moves each as the
            # server falls behind (the newest frame per view), so this compares where B/frame cannot
            "bytes_per_move_tab": d["body"] / (self.moves * args.tabs) if self.moves else float("nan"),
            "moves_per_board_frame": self.moves / (d["board"] / args.tabs) if d["board"] else float("nan"),
            "decoded_mb_s": d["decoded"] / wall / 1e6,
            "wire_mb_s": d["wire"] / wall / 1e6,
            "server_cores": server_cpu / wall,
            "server_ms_per_frame": server_cpu / d["events"] * 1e3 if d["events"] else float("nan"),
            "server_ms_per_move": server_cpu / self.moves * 1e3 if self.moves else float("nan"),
            "server_ms_per_board_frame": server_cpu / d["board"] * 1e3 if d["board"] else float("nan"),
            "backend": self.server.backend,
            "db_cores": db_cpu / wall if (db_pid or self.server.backend == "sqlite") else float("nan"),
            "total_ms_per_move": (server_cpu + db_cpu) / self.moves * 1e3 if self.moves else float("nan"),
            "client_cores": client_cpu / wall,
            "server_runqueue_wait_cores": (rq1 - rq0) / wall,
            "other_cores": max(0.0, (machine - server_cpu - client_cpu - db_cpu) / wall),
            "server_peak_rss_mib": mem["VmHWM"],
            "server_rss_mib": mem["VmRSS"],
            "server_rss_base_mib": rss_base,
            "mib_per_stream_open": (rss_streams - rss_base) / args.tabs,
            "mib_per_stream_end": (mem["VmRSS"] - rss_base) / args.tabs,
            "p50_ms": percentile(self.latencies, 50) * 1e3,
            "p95_ms": percentile(self.latencies, 95) * 1e3,
            "p99_ms": percentile(self.latencies, 99) * 1e3,
            "max_ms": max(self.latencies) * 1e3 if self.latencies else float("nan"),
            "post_p50_ms": percentile(self.post_latencies, 50) * 1e3,
            "post_p95_ms": percentile(self.post_latencies, 95) * 1e3,
            "stream_errors": errors[:3],
            "stream_errors_n": len(errors),
            "reconnects": len(self.reconnects),
            "reconnects_in_window": in_window,
            "reconnects_at_s": [round(x, 2) for x in ended_at][:12],
            "reconnects_after_events": sorted(events for _, _, events, _ in self.reconnects)[:12],
            "server_loop": proc_loop(pid),
            "server_http": self.server.tree.http,
            "tree": self.server.tree.name,
            "profile": str(self.profile_out) if self.profile_out else None,
            "profile_error": spy_err,
            "thread_cpu": thread_cpu,
        }


def client_loop_runner(coro: Any) -> Any:
    if uvloop is not None:
        return uvloop.run(coro)
    return asyncio.run(coro)


def one_run(args: argparse.Namespace, tmp: Path, template: Path, encoding: str, rate: float,
            profile_out: Path | None = None, tree: Tree | None = None, workers: int = 1,
            backend: str | None = None, pg: PgBoards | None = None) -> dict[str, Any]:
    label = f"{encoding}-{rate:g}-w{workers}" + ("-profiled" if profile_out else "")
    if tree is not None:
        label = f"{tree.name} {label}"
    if backend is not None:
        label = f"{backend} {label}"
    if args.quiet > 0:
        others = wait_for_quiet(args.quiet)
        print(f"  others used {others:.2f} cores just before the {label} run", flush=True)
    db: Path | str = tmp / f"{label.replace(' ', '-')}.db"
    if tree is not None and tree.name == "old":  # the old checkout seeds a board of its own schema
        old_template = tmp / "seeded-old.db"
        if not old_template.exists():
            seed(old_template, args.cards, tree.py, tree.root)
        template = old_template
    if backend == "postgres":
        assert pg is not None
        db = pg.fresh("kanban_run")
    else:
        shutil.copy(template, db)
    cards, lanes = board_layout(db)
    what_if = tuple(w for w in args.what_if.split(",") if w)
    server = Server(db, args.server_loop, tmp / f"{label.replace(' ', '-')}.log", args.switch_interval, what_if, tree,
                    workers, backend or "sqlite", pg.postmaster() if backend == "postgres" and pg else None)
    server.start()
    try:
        result = client_loop_runner(Run(args, encoding, rate, server, cards, lanes, profile_out).run())
    finally:
        server.stop()
        if backend == "postgres" and pg is not None:
            pg.drop(str(db))
    if tree is not None:
        result["label"] = f"{tree.name} {result['label']}"
    if backend is not None:
        result["label"] = f"{backend} {result['label']}"
    tail = server.tail(800)
    if "Traceback" in tail or "ERROR" in tail:
        result["server_log_tail"] = tail
    return result


# -- the ceiling: the writer alone, in process ----------------------------------------------------


async def _ceiling(db: str, seconds: float, producers: int, warmup: float,
                   what_if: tuple[str, ...] = (), db_pid: int = 0, batch_size: int = 0) -> dict[str, Any]:
    os.environ["KANBAN_DB"] = db  # the example's Lith reads it at import
    for w in what_if:
        exec(WHAT_IF[w], {})  # noqa: S102 - our own diagnostic patch, as the server gets it
    from examples.kanban.commands import MoveCard
    from examples.kanban.live import lith

    cards, lanes = board_layout(db if "://" in db else Path(db))
    writer = lith.writer
    if batch_size:
        writer.batch_size = batch_size
    await writer.start()
    state = {"running": True, "measuring": False, "done": 0, "failed": 0}
    ops = iter(range(1, 1 << 62))

    async def producer(k: int) -> None:
        rng = random.Random(k * 7919 + 17)
        tab = f"ceiling-{k:03d}"
        while state["running"]:
            # built per call from the same JSON fields as the route's body
            cmd = MoveCard(tab=tab, op=next(ops), card_id=rng.choice(cards), lane_id=rng.choice(lanes),
                           position=rng.randrange(0, 60))
            try:
                await writer.do(cmd)
            except Exception:  # noqa: BLE001 - counted
                state["failed"] += 1
                continue
            if state["measuring"]:
                state["done"] += 1

    tasks = [asyncio.create_task(producer(k)) for k in range(producers)]
    await asyncio.sleep(warmup)
    dbc0 = proc_cpu(db_pid) if db_pid else 0.0
    c0, b0, cpu0, t0 = writer.commands, writer.batches, time.process_time(), time.perf_counter()
    state["measuring"] = True
    await asyncio.sleep(seconds)
    state["measuring"] = False
    t1, cpu1, c1, b1 = time.perf_counter(), time.process_time(), writer.commands, writer.batches
    dbc1 = proc_cpu(db_pid) if db_pid else 0.0
    state["running"] = False
    await asyncio.gather(*tasks)
    await writer.close()
    wall = t1 - t0
    return {
        "moves": state["done"],
        "moves_s": state["done"] / wall,
        "per_batch": (c1 - c0) / (b1 - b0) if b1 > b0 else float("nan"),
        "cores": (cpu1 - cpu0) / wall,
        "cpu_us_per_move": (cpu1 - cpu0) / (c1 - c0) * 1e6 if c1 > c0 else float("nan"),
        "db_cores": (dbc1 - dbc0) / wall,
        "db_cpu_us_per_move": (dbc1 - dbc0) / (c1 - c0) * 1e6 if c1 > c0 else float("nan"),
        "failed": state["failed"],
        "loop": "uvloop" if uvloop is not None else "asyncio",
    }


def run_ceiling(args: argparse.Namespace, tmp: Path, template: Path, backend: str | None = None,
                pg: PgBoards | None = None, batch_size: int = 0) -> dict[str, Any]:
    db: Path | str = tmp / "ceiling.db"
    db_pid = 0
    if backend == "postgres":
        assert pg is not None
        db, db_pid = pg.fresh("kanban_ceiling"), pg.postmaster() or 0
    else:
        shutil.copy(template, db)
    try:
        out = subprocess.run(
            [PY, str(Path(__file__).resolve()), "--ceiling-target", str(db), "--window", str(args.ceiling_seconds),
             "--tabs", str(args.tabs), "--what-if", args.what_if, "--db-pid", str(db_pid),
             "--batch-size", str(batch_size)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )
    finally:
        if backend == "postgres" and pg is not None:
            pg.drop(str(db))
    if out.returncode:
        raise RuntimeError(f"ceiling failed:\n{out.stderr[-2000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "backend": backend or "sqlite",
            "batch_size": batch_size or "default"}


# -- py-spy summary ---------------------------------------------------------------------------------

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_THREAD = re.compile(r"^thread \((?P<tid>\d+|0x[0-9a-f]+)\):?\s*(?P<name>.*)$")

GROUPS = {
    "rendering": "rendering (views, htpy, SQL reads, Datastar event)",
    "encoding": "encoding (zstd/brotli, on the fan-out threads since issue 12)",
    "writer": "writer thread (MoveCard, SQLite or PostgreSQL, savepoints)",
    "http": "HTTP requests (uvicorn + h11 or httptools, FastAPI/Starlette, pydantic, routes)",
    "sse": "SSE send path (sse-starlette, anyio, lith streams)",
    "hub": "hub tick/fan-out, writer loop side",
    "loop": "event loop (uvloop C: sockets, epoll; asyncio glue, thread hops)",
    "other": "other",
}

# Leaves of a thread that waits (py-spy reports them although they use no CPU).
_IDLE = (
    ("threading.py", "wait"), ("queue.py", "get"), ("concurrent/futures/thread.py", "_worker"),
    ("aiosqlite/core.py", "_connection_worker_thread"), ("selectors.py", "select"),
    ("fastapi_lith/engine/threads.py", "_work"),  # a lith Threads thread blocked on its SimpleQueue
)


_WRITERS = ("fastapi_lith/engine/writer.py", "fastapi_lith/backends/postgres/writer.py")
_SQL = ("fastapi_lith/engine/db.py", "fastapi_lith/engine/statements.py", "fastapi_lith/backends/postgres/db.py")


def parse_frame(text: str) -> tuple[str, str, int]:
    m = _FRAME.match(text.strip())
    if not m:
        return text.strip(), "", 0
    return m["func"], m["file"], int(m["line"] or 0)


def _in(f: str, package: str) -> bool:
    return f.startswith(package + "/") or f"/{package}/" in f


def classify(frames: list[tuple[str, str, int]]) -> tuple[str, str]:
    """(group, detail) of one sampled stack, root first."""
    leaf_first = list(reversed(frames))
    if not frames:
        return "other", "?"
    lf, lfile, _ = leaf_first[0]
    if any(lfile.endswith(f) and lf.rsplit(".", 1)[-1] == fn for f, fn in _IDLE):
        return "idle", lf
    if lf == "Runner.run" or (lfile.endswith("asyncio/runners.py")):
        return "loop", "uvloop C (sockets, epoll, callbacks)"
    if any(fn.endswith("_apply") and f.endswith(_WRITERS) for fn, f, _ in frames):
        if any("examples/kanban" in f for _, f, _ in frames):
            if any(fn.startswith("Db.executemany") for fn, _, _ in frames):
                return "writer", "MoveCard: Db.executemany (PLACE_CARD per card of the lane)"
            if any(f.endswith(_SQL) or _in(f, "psycopg") for _, f, _ in frames):
                return "writer", "commands: other statements"
            return "writer", "commands (Python)"
        if any(_in(f, "psycopg") for _, f, _ in frames):
            return "writer", "savepoints, outcomes, NOTIFY, commit (psycopg)"
        return "writer", "savepoints, commit"
    if any(f.endswith("fastapi_lith/engine/encoders.py") for _, f, _ in frames):
        return "encoding", "encoder.encode"
    rendering = any(fn == "Instance.render" for fn, _, _ in frames) or any(
        fn == "Readers.call" for fn, _, _ in frames)
    if rendering:
        for fn, f, _ in leaf_first:
            if "datastar_py" in f:
                return "rendering", "Datastar event (datastar-py)"
            if _in(f, "htpy") or _in(f, "markupsafe"):
                return "rendering", "htpy / markupsafe"
            if "examples/kanban/views.py" in f:
                return "rendering", "kanban views (Python)"
            if f.endswith("fastapi_lith/engine/views.py"):
                return "rendering", f"lith views.py {fn}"
            if f.endswith(_SQL) or _in(f, "psycopg"):
                return "rendering", "SQL reads"
            if f.endswith("fastapi_lith/engine/hub.py"):
                return "rendering", f"hub.py {fn}"
        return "rendering", "other"
    if any(_in(f, "sse_starlette") for _, f, _ in frames):  # a stream's body, past its encoder
        for fn, f, _ in leaf_first:
            if _in(f, "h11") or _in(f, "uvicorn"):
                return "sse", "uvicorn send (h11 chunk + socket write)"
            if _in(f, "anyio"):
                return "sse", "anyio (sse-starlette's send_timeout scope, task group)"
            if _in(f, "sse_starlette"):
                return "sse", "sse-starlette"
            if f.endswith(("fastapi_lith/engine/streams.py", "fastapi_lith/lith.py")):
                return "sse", f"lith {Path(f).name} {fn}"
        return "sse", "asyncio glue"
    for fn, f, _ in leaf_first:
        if _in(f, "sse_starlette"):
            return "sse", "sse-starlette"
        if f.endswith("fastapi_lith/engine/streams.py"):
            return "sse", f"lith streams.py {fn}"
        if f.endswith("fastapi_lith/lith.py"):
            return "sse", f"lith app.py {fn}"
        if f.endswith(("fastapi_lith/engine/hub.py", "fastapi_lith/backends/postgres/feed.py")):
            return "hub", f"{Path(f).name} {fn}"
        if f.endswith("fastapi_lith/engine/writer.py"):
            return "hub", f"writer.py {fn}"
        if "examples/kanban" in f:
            return "http", "kanban routes"
        if _in(f, "pydantic") or _in(f, "pydantic_core"):
            return "http", "pydantic"
        if _in(f, "fastapi"):
            return "http", "fastapi"
        if _in(f, "starlette"):
            return "http", "starlette"
        if _in(f, "h11") or _in(f, "uvicorn") or _in(f, "httptools"):
            return "http", "uvicorn + h11 or httptools"
        if _in(f, "anyio"):
            return "sse", "anyio"
        if _in(f, "json") or f.endswith("email/message.py"):
            return "http", "json / headers"
        if _in(f, "asyncio") or "uvloop" in f or "concurrent/futures" in f or f.endswith("threading.py"):
            return "loop", f"{Path(f).name} {fn}"
    return "other", Path(lfile).name or lf


def summarize(path: Path, thread_cpu: dict[str, float] | None = None, wall: float = 0.0,
              top: int = 12) -> dict[str, Any]:
    """Where the server's CPU went. Samples are split by thread; with `thread_cpu` (tid -> CPU
    seconds over the same window, from /proc) each thread's samples are scaled to its real CPU,
    so a thread waiting on the GIL or in a blocking call costs what it cost, not its samples."""
    by_thread: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
    names: dict[str, str] = {}
    leaves: Counter[str] = Counter()
    lith_incl: Counter[str] = Counter()
    active = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        parts = stack.split(";")
        if parts[0].startswith("process"):  # --subprocesses: the processes (a command line may
            # hold a ";") come before the thread
            parts = next((parts[i:] for i, part in enumerate(parts) if _THREAD.match(part)), parts)
        m = _THREAD.match(parts[0])
        tid, body = ("?", parts) if not m else (m["tid"], parts[1:])
        if m:
            names[tid] = m["name"] or tid
        if body and body[0].startswith("process"):
            body = body[1:]
        frames = [parse_frame(p) for p in body]
        g, d = classify(frames)
        if g == "other":  # a stack py-spy --nonblocking caught half-built: the thread decides
            name = names.get(tid, "")
            if "reader" in name:
                g, d = "rendering", "stack cut short (reader thread)"
            elif "writer" in name:
                g, d = "writer", "stack cut short (writer thread)"
        by_thread[tid][(g, d)] += n
        if g == "idle":
            continue
        active += n
        if frames:
            fn, f, ln = frames[-1]
            leaves[f"{fn} ({f}:{ln})"] += n
        seen = set()
        for fn, f, ln in frames:
            if "fastapi_lith/" in f:
                key = f"{f[f.index('fastapi_lith/'):]}:{ln} {fn}"
                if key not in seen:
                    seen.add(key)
                    lith_incl[key] += n
    # weights: CPU seconds per sample of each thread (or one sample = one unit without /proc)
    cost: Counter[tuple[str, str]] = Counter()
    threads: Counter[str] = Counter()
    for tid, counts in by_thread.items():
        busy = {k: v for k, v in counts.items() if k[0] != "idle"}
        nbusy = sum(busy.values())
        if not nbusy:
            continue
        if thread_cpu is not None and wall > 0:
            cpu = thread_cpu.get(tid, 0.0) / wall  # cores
            loop_c = ("loop", "uvloop C (sockets, epoll, callbacks)")
            if names.get(tid) == "MainThread" and loop_c in busy:
                # uvloop's C code and its epoll wait share one leaf: the Python samples are
                # ~10 ms each, the rest of the thread's CPU is the loop's C code.
                py = sum(v for k, v in busy.items() if k != loop_c)
                py_cores = min(cpu, py * 0.01 / wall)
                for k, v in busy.items():
                    if k != loop_c:
                        cost[k] += py_cores * v / py if py else 0.0
                cost[loop_c] += cpu - py_cores
            else:
                for k, v in busy.items():
                    cost[k] += cpu * v / nbusy
            threads[names.get(tid, tid)] += cpu
        else:
            for k, v in busy.items():
                cost[k] += v
            threads[names.get(tid, tid)] += nbusy
    # threads of one kind together (40 AnyIO workers, 2 readers)
    kinds: Counter[str] = Counter()
    for name, v in threads.items():
        kinds[re.sub(r"[_ ]?\d+$", "", re.sub(r"Thread-\d+ ", "", name))] += v
    total_cost = sum(cost.values()) or 1.0
    groups: Counter[str] = Counter()
    for (g, _), v in cost.items():
        groups[g] += v
    unit = "cores" if thread_cpu is not None else "samples"
    return {
        "samples_active": active,
        "unit": unit,
        "total": total_cost,
        "groups": [(GROUPS[g], v, 100 * v / total_cost) for g, v in groups.most_common()],
        "details": [(f"{g}: {d}", v, 100 * v / total_cost) for (g, d), v in cost.most_common(top * 2)],
        "threads": [(t, v, 100 * v / total_cost) for t, v in kinds.most_common(8)],
        "leaves": [(k, n, 100 * n / active) for k, n in leaves.most_common(top)],
        "lith_lines": [(k, n, 100 * n / active) for k, n in lith_incl.most_common(top * 2)],
    }


def print_summary(s: dict[str, Any]) -> None:
    print(f"  {s['samples_active']:,} active samples; shares of {s['total']:.2f} {s['unit']}")
    for title, key in (("by part", "groups"), ("in detail", "details"), ("by thread", "threads")):
        print(f"  {title}:")
        for name, v, p in s[key]:
            print(f"    {p:5.1f}%  {v:6.2f}  {name}" if s["unit"] == "cores" else f"    {p:5.1f}%  {name}")
    for title, key in (("leaf frames, % of active samples", "leaves"),
                       ("lith lines, inclusive, % of active samples", "lith_lines")):
        print(f"  {title}:")
        for name, _, p in s[key]:
            print(f"    {p:5.1f}%  {name}")


# -- reporting --------------------------------------------------------------------------------------


def fmt(v: float, digits: int = 0) -> str:
    return f"{v:,.{digits}f}" if v == v else "n/a"


def print_table(results: list[dict[str, Any]], ceilings: list[dict[str, Any]]) -> None:
    print("| run (offered moves/s) | moves/s | frames/s | bytes/frame | server cores | server ms CPU/frame "
          "| client cores | others' cores | server peak RSS | post→frame p50 / p95 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['label']} | {fmt(r['moves_s'])} | {fmt(r['frames_s'])} | {fmt(r['bytes_per_frame'])} "
              f"| {r['server_cores']:.2f} | {r['server_ms_per_frame']:.2f} | {r['client_cores']:.2f} "
              f"| {r['other_cores']:.2f} | {r['server_peak_rss_mib']:.0f} MiB "
              f"| {r['p50_ms']:,.0f} / {r['p95_ms']:,.0f} ms |")
    for ceiling in ceilings:
        on = f" ({ceiling['backend']}, batch_size {ceiling['batch_size']})" if len(ceilings) > 1 else ""
        print(f"| writer alone, in process, 200 producers{on} | {fmt(ceiling['moves_s'])} | | | {ceiling['cores']:.2f} "
              f"| | | | | |")


COMPARED = (
    ("moves/s", "moves_s", "{:,.0f}"),
    ("post→204 p50 ms", "post_p50_ms", "{:,.0f}"),
    ("post→frame p50 ms", "p50_ms", "{:,.0f}"),
    ("post→frame p95 ms", "p95_ms", "{:,.0f}"),
    ("board frames per tab per s", "board_frames_per_tab_s", "{:.1f}"),
    ("bytes per frame", "bytes_per_frame", "{:,.0f}"),
    ("server cores", "server_cores", "{:.2f}"),
    ("server ms CPU per frame", "server_ms_per_frame", "{:.3f}"),
    ("server ms CPU per board frame", "server_ms_per_board_frame", "{:.3f}"),
    ("MiB per stream (end)", "mib_per_stream_end", "{:.2f}"),
    ("others' cores", "other_cores", "{:.2f}"),
    ("lost moves", "lost", "{:,.0f}"),
)
# Beside the server: the database's own processes (PostgreSQL; none on SQLite).
COMPARED_DB = (
    ("post→204 p95 ms", "post_p95_ms", "{:,.0f}"),
    ("server ms CPU per move", "server_ms_per_move", "{:.2f}"),
    ("database server cores", "db_cores", "{:.2f}"),
    ("server + database ms CPU per move", "total_ms_per_move", "{:.2f}"),
    ("runnable, waiting for a CPU (cores)", "server_runqueue_wait_cores", "{:.2f}"),
)


def print_compare(results: list[dict[str, Any]], by: str = "tree", a: str = "old", b: str = "new") -> None:
    """`a` and `b` (old and new checkouts, or SQLite and PostgreSQL) side by side per (encoding,
    rate, processes): medians over the rounds, and b / a."""
    import statistics

    runs: dict[tuple[str, float, int], dict[str, list[dict[str, Any]]]] = {}
    for r in results:
        runs.setdefault((r["encoding"], r["rate_offered"], r["workers"]), {}).setdefault(r[by], []).append(r)
    for (encoding, rate, workers), variants in runs.items():
        first, second = variants.get(a, []), variants.get(b, [])
        if not first or not second:
            continue
        if by == "tree":
            names = f"{a} (http {first[0]['server_http']}) vs {b} (http {second[0]['server_http']})"
        else:
            names = f"{a} vs {b}"
        print(f"\n{encoding} at {rate:g} offered, {workers} process{'es' if workers > 1 else ''}: {names}, "
              f"medians of {len(first)} and {len(second)} runs")
        print(f"| figure | {a} | {b} | {b} / {a} |")
        print("|---|---:|---:|---:|")
        compared = COMPARED if by == "tree" else COMPARED + COMPARED_DB
        for title, key, form in compared:
            o = statistics.median(float(r[key]) for r in first)
            n = statistics.median(float(r[key]) for r in second)
            ratio = f"{n / o:.2f}×" if o and o == o and n == n else "–"
            print(f"| {title} | {form.format(o)} | {form.format(n)} | {ratio} |")


def print_report(results: list[dict[str, Any]], ceilings: list[dict[str, Any]]) -> None:
    for r in results:
        print(f"\n{r['label']}: {r['tabs']} tabs, offered {r['rate_offered'] or 'unpaced'} moves/s, "
              f"window {r['window_s']:.1f} s; server loop {r['server_loop']}, http {r['server_http']}")
        print(f"  moves/s {r['moves_s']:,.0f} (statuses {r['statuses']}, lost {r['lost']}); "
              f"post→204 p50 {r['post_p50_ms']:.1f} ms, p95 {r['post_p95_ms']:.1f} ms")
        print(f"  post→frame p50 {r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
              f"max {r['max_ms']:.0f} ms")
        print(f"  frames/s {r['frames_s']:,.0f} (board {r['board_frames_s']:,.0f} = "
              f"{r['board_frames_per_tab_s']:.1f} per tab, outcome {r['outcome_frames_s']:,.0f}); "
              f"writes/s {r['chunks_s']:,.0f}; keep-alives {r['keepalives']}")
        print(f"  bytes/frame {r['bytes_per_frame']:,.0f} (per write {r['bytes_per_chunk']:,.0f}; "
              f"{r['moves_per_board_frame']:.1f} moves per board frame; {r['bytes_per_move_tab']:.0f} B "
              f"per move per tab); "
              f"wire {r['wire_mb_s']:.2f} MB/s, decoded {r['decoded_mb_s']:.0f} MB/s")
        print(f"  server {r['server_cores']:.2f} cores ({r['server_ms_per_frame']:.2f} ms CPU per frame, "
              f"{r['server_ms_per_move']:.2f} per move; runnable but waiting for a CPU "
              f"{r['server_runqueue_wait_cores']:.2f}), client {r['client_cores']:.2f}, others "
              f"{r['other_cores']:.2f}; server RSS peak {r['server_peak_rss_mib']:.0f} MiB, end "
              f"{r['server_rss_mib']:.0f} MiB (before streams {r['server_rss_base_mib']:.0f}; "
              f"{r['mib_per_stream_end']:.2f} MiB per stream)")
        if r.get("backend") == "postgres":
            print(f"  PostgreSQL's processes {r['db_cores']:.2f} cores; server + database "
                  f"{r['total_ms_per_move']:.2f} ms CPU per move")
        if r["stream_errors_n"]:
            print(f"  STREAM ERRORS: {r['stream_errors_n']} {r['stream_errors']}")
        if r["reconnects"]:
            print(f"  streams the server ended (the client reconnected at once): {r['reconnects']}, "
                  f"{r['reconnects_in_window']} in the window; at {r['reconnects_at_s']} s from the "
                  f"window's start, after {r['reconnects_after_events']} events")
        if r.get("server_log_tail"):
            print("  server log:\n" + r["server_log_tail"])
    for ceiling in ceilings:
        print(f"\nwriter alone, in process, on {ceiling['backend']} ({ceiling['loop']}; batch_size "
              f"{ceiling['batch_size']}): {ceiling['moves_s']:,.0f} "
              f"moves/s, {ceiling['per_batch']:.0f} per batch, {ceiling['cores']:.2f} cores, "
              f"{ceiling['cpu_us_per_move']:.0f} µs CPU per move"
              + (f" (+ PostgreSQL's processes {ceiling['db_cores']:.2f} cores, {ceiling['db_cpu_us_per_move']:.0f} µs "
                 f"per move)" if ceiling["backend"] == "postgres" else "")
              + f", failed {ceiling['failed']}")
    print()
    print_table(results, ceilings)
    print("\nAgainst lith (Go) over HTTP, 200 tabs, and the goals:")
    for r in results:
        lith = LITH.get(r["encoding"])
        if lith:
            go_ms = lith["cores"] / LITH_FRAMES_S * 1e3
            print(f"  {r['label']}: server {r['server_cores']:.2f} cores vs lith {lith['cores']} "
                  f"({r['server_cores'] / lith['cores']:.2f}x); {r['bytes_per_frame']:,.0f} B/frame vs "
                  f"{lith['bytes']:,} ({r['bytes_per_frame'] / lith['bytes']:.2f}x); "
                  f"board frames/s {r['board_frames_s']:,.0f} vs lith's hub {LITH_FRAMES_S:,} "
                  f"({r['board_frames_s'] / LITH_FRAMES_S:.2f}x); B per move per tab "
                  f"{r['bytes_per_move_tab']:.0f} vs lith ~{lith['bytes'] * LITH_FRAMES_S / (800 * 200):.0f}; "
                  f"server CPU per board frame delivered {r['server_ms_per_board_frame']:.2f} ms vs lith "
                  f"~{go_ms:.2f} ({r['server_ms_per_board_frame'] / go_ms:.1f}x)")
        if r["encoding"] == "zstd":
            ok = r["server_cores"] < GOAL_CORES_ZSTD
            print(f"  goal server < {GOAL_CORES_ZSTD} cores with zstd: {'met' if ok else 'MISSED'} "
                  f"({r['server_cores']:.2f}, {r['server_cores'] - GOAL_CORES_ZSTD:+.2f})")
        ok = r["p95_ms"] < GOAL_P95_MS
        print(f"  goal post→frame p95 < {GOAL_P95_MS:.0f} ms ({r['label']}): {'met' if ok else 'MISSED'} "
              f"({r['p95_ms']:.1f} ms, {r['p95_ms'] - GOAL_P95_MS:+.1f}; kanban in Go {GO_KANBAN_P95_MS:.0f} ms)")


# -- main ---------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="measured window per encoding (default 30)")
    ap.add_argument("--quick", action="store_true", help="10 s windows")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each window")
    ap.add_argument("--tabs", type=int, default=200, help="streams, and producers (one per tab)")
    ap.add_argument("--cards", type=int, default=200)
    ap.add_argument("--rate", type=float, default=800.0, help="moves/s offered by all producers (0: unpaced)")
    ap.add_argument("--encodings", default="zstd,br")
    ap.add_argument("--workers", default="1", metavar="N,...",
                    help="uvicorn processes on the one database, each config run for each (e.g. 1,2)")
    ap.add_argument("--light-rate", type=float, default=40.0,
                    help="and one zstd run at this light load, to see latency below saturation (0: skip)")
    ap.add_argument("--server-loop", default="uvloop" if uvloop is not None else "asyncio",
                    choices=("uvloop", "asyncio"))
    ap.add_argument("--switch-interval", type=float, default=0.0, metavar="SECONDS",
                    help="diagnostic: start the server with sys.setswitchinterval(SECONDS) (default: "
                         "Python's 0.005)")
    ap.add_argument("--what-if", default="", metavar="FIX,...",
                    help=f"diagnostic: patch suggested fixes into the server ({', '.join(WHAT_IF)})")
    ap.add_argument("--frame-timeout", type=float, default=10.0, help="a move with no frame by then is lost")
    ap.add_argument("--ceiling-seconds", type=float, default=5.0)
    ap.add_argument("--no-ceiling", action="store_true")
    ap.add_argument("--profile", action="store_true", help="and a zstd run at --rate under py-spy (10 s window), summarised")
    ap.add_argument("--quiet", type=float, default=10.0, metavar="SECONDS",
                    help="before each run, wait up to this long for other processes to use < 0.35 cores")
    ap.add_argument("--spy-blocking", dest="spy_nonblocking", action="store_false",
                    help="let py-spy pause the server for each sample (its default; here it halved the "
                         "server's throughput), instead of --nonblocking")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--old", default="", metavar="DIR",
                    help="a second checkout (with its .venv) whose server takes turns with this one's")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each (encoding, rate, tree); medians")
    ap.add_argument("--backends", default="", metavar="sqlite,postgres",
                    help="the same load on the board served from each database, taking turns run by run "
                         "(postgres: a throwaway cluster, or LITH_PG_URL)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (dbs, logs, profile)")
    ap.add_argument("--summarize", default="", help="summarise an existing py-spy raw file and exit")
    ap.add_argument("--ceiling-target", default="", help=argparse.SUPPRESS)
    ap.add_argument("--db-pid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ceiling-batches", default="", metavar="N,...",
                    help="the writer alone at each of these batch sizes (default: the writer's own); "
                         "with --encodings '' --light-rate 0, the writer alone and nothing else")
    ap.add_argument("--window", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.summarize:
        raw = Path(args.summarize)
        if raw.suffix == ".json":  # a --json file of a --profile run: its raw file and thread CPU
            profiled = json.loads(raw.read_text())["profiled"]
            print_summary(summarize(Path(profiled["profile"]), profiled["thread_cpu"], profiled["window_s"]))
        else:
            print_summary(summarize(raw))
        return
    if args.ceiling_target:
        what_if = tuple(w for w in args.what_if.split(",") if w)
        result = client_loop_runner(_ceiling(args.ceiling_target, args.window, args.tabs, 1.0, what_if, args.db_pid,
                                                    args.batch_size))
        print(json.dumps(result))
        return

    args.window = 10.0 if args.quick else args.seconds
    backends = [b for b in args.backends.split(",") if b]
    if any(b not in ("sqlite", "postgres") for b in backends):
        ap.error("--backends takes sqlite and postgres")
    if backends and args.old:
        ap.error("--old and --backends compare one thing at a time")
    pg = PgBoards(args.cards) if "postgres" in backends else None
    tmp = Path(tempfile.mkdtemp(prefix="lith-kanban-"))
    found = print_conditions(
        loop=f"server: {args.server_loop} (uvicorn --loop {args.server_loop} --http {HTTP_IMPL}"
             f"{'; the old checkout with the http it has installed' if args.old else ''}); "
             f"client: {'uvloop' if uvloop else 'asyncio'}",
        tmpdir=tmp,
        sources=("fastapi_lith/lith.py", "fastapi_lith/engine/hub.py", "fastapi_lith/engine/streams.py",
                 "fastapi_lith/engine/encoders.py", "fastapi_lith/engine/writer.py", "fastapi_lith/engine/views.py",
                 "examples/kanban/views.py", "examples/kanban/commands.py", "examples/kanban/app.py",
                 "bench/kanban.py",
                 *(("fastapi_lith/backends/postgres/db.py", "fastapi_lith/backends/postgres/writer.py",
                    "fastapi_lith/backends/postgres/feed.py") if pg else ())),
        packages=(*DEFAULT_PACKAGES, *(("psycopg",) if pg else ())),
        postgres=f"{pg.version()}, {pg.described}" if pg else None,
        backends=", ".join(backends) or None,
        what_if=args.what_if or None,
        switch_interval=args.switch_interval or None,
        load=f"{args.tabs} tabs, {args.rate:g} moves/s offered (and {args.light_rate:g} for zstd), "
             f"{args.window:g} s windows after {args.warmup:g} s",
    )
    template = tmp / "seeded.db"
    seed(template, args.cards)
    print(f"seeded {template}: {args.cards} cards on board {BOARD_ID}", flush=True)

    results: list[dict[str, Any]] = []
    profile: dict[str, Any] | None = None
    try:
        plan = [(e, args.rate) for e in args.encodings.split(",") if e]
        if args.light_rate and "zstd" in args.encodings.split(","):
            plan.append(("zstd", args.light_rate))
        trees = [Tree.old(Path(args.old).resolve()), Tree("new", ROOT, PY, HTTP_IMPL)] if args.old else [None]
        for _ in range(args.rounds):
            for encoding, rate in plan:
                for workers in (int(w) for w in args.workers.split(",")):
                    for tree in trees:  # old and new take turns, run by run
                        for backend in backends or [None]:  # and so do SQLite and PostgreSQL
                            print(f"running {encoding} at {rate:g} moves/s, {workers} process(es)"
                                  f"{' (' + tree.name + ')' if tree else ''}{' on ' + backend if backend else ''} ...",
                                  flush=True)
                            results.append(one_run(args, tmp, template, encoding, rate, tree=tree, workers=workers,
                                                   backend=backend, pg=pg))
        batches = [int(n) for n in args.ceiling_batches.split(",") if n] or [0]
        ceilings = [] if args.no_ceiling else [run_ceiling(args, tmp, template, b, pg, n)
                                               for n in batches for b in backends or [None]]
        profiled_runs: list[dict[str, Any]] = []
        if args.profile:
            window, args.window = args.window, 10.0
            workers = int(args.workers.split(",")[-1])
            for backend in backends or [None]:
                print(f"running zstd under py-spy{' on ' + backend if backend else ''} ...", flush=True)
                profiled_runs.append(one_run(args, tmp, template, "zstd", args.rate, workers=workers, backend=backend,
                                             pg=pg, profile_out=tmp / f"zstd-{backend or 'sqlite'}.raw"))
            args.window = window
        profiled = profiled_runs[0] if profiled_runs else None
        print_report(results, ceilings)
        if args.old:
            print_compare(results)
        if len(backends) == 2:
            print_compare(results, "backend", backends[0], backends[1])
        for profiled in profiled_runs:
            print(f"\nProfiled {profiled['label']} (py-spy record -r 100 -f raw -d 10 --threads"
                  f"{' --nonblocking' if args.spy_nonblocking else ''}, on the server; shares scaled to each "
                  f"thread's CPU from /proc):")
            print(f"  moves/s {profiled['moves_s']:,.0f}, server {profiled['server_cores']:.2f} cores, "
                  f"database {profiled['db_cores']:.2f}, p95 {profiled['p95_ms']:.1f} ms  {profiled['profile_error']}")
            raw = Path(profiled["profile"])
            if raw.exists() and raw.stat().st_size:
                profile = summarize(raw, profiled["thread_cpu"], profiled["window_s"])
                print_summary(profile)
                print(f"  raw profile: {raw}")
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"conditions": one_line(found), "runs": results, "ceiling": ceilings, "profiled": profiled,
                 "profiled_runs": profiled_runs,
                 "profile": profile}, indent=1, default=str))
    finally:
        if pg is not None:
            pg.stop()
        if not (args.keep or args.profile):
            shutil.rmtree(tmp, ignore_errors=True)
    print("\nload average at the end:", load_average())


if __name__ == "__main__":
    main()
