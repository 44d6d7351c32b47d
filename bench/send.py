"""What one SSE chunk costs the server, layer by layer, and what one POST costs, h11 vs httptools.

A real uvicorn (`--loop uvloop`, `--http h11` or `httptools`) serves this module's `app`; a
client in this process reads the bodies over 127.0.0.1 and posts. The server's CPU (utime +
stime of its process, every thread) over each run, divided by the chunks (or POSTs) it served,
is the figure; the layers take turns, `--reps` rounds, and the medians are printed.

Layers, each adding one thing to the one above:
  raw         a bare ASGI app: one `send` per chunk
  starlette   Starlette's StreamingResponse over an async generator
  sse         sse-starlette's EventSourceResponse, no ping, no send timeout
  sse+timeout the same with a send timeout and a shutdown event (an AnyIO cancel scope per send)
  lith-timeout  the same through `web.sse.StreamResponse`, lith's subclass (one asyncio timeout
              per send instead of the cancel scope)
  lith        lith's stream body: frames offered to a `Stream`, encoded (identity) by the fan-out,
              written by `Stream.body` inside `web.sse.tab_body`, through lith-timeout. A frame is
              offered as soon as the previous one is taken. Chunks under the fan-out's
              INLINE_BELOW are encoded on the loop; `--size 8000` sends them to the workers.
POST: a FastAPI route validating a small JSON body into a Pydantic model, answering 204.

    python bench/send.py                  # about a minute
    python bench/send.py --chunks 20000 --conns 20 --reps 5 --posts 4000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

class Move(BaseModel):
    """The kanban example's move, as its page posts it."""

    tab: str
    op: int
    card_id: int
    lane_id: int
    position: int


LAYERS = ("raw", "starlette", "sse", "sse+timeout", "lith-timeout", "lith")


# -- the server side -----------------------------------------------------------------------------


def make_app() -> Any:
    import anyio
    from fastapi import FastAPI
    from sse_starlette import EventSourceResponse
    from starlette.responses import StreamingResponse

    from fastapi_lith.engine.encoders import IdentityEncoder
    from fastapi_lith.engine.frames import Frame, sse_event
    from fastapi_lith.engine.streams import Stream, Subscription
    from fastapi_lith.web.sse import StreamResponse, tab_body

    api = FastAPI()

    def chunks(n: int, size: int) -> Any:
        chunk = b"data: " + b"x" * max(0, size - 8) + b"\n\n"

        async def gen() -> Any:
            for _ in range(n):
                yield chunk

        return gen(), chunk

    def sse(gen: Any, timeout: bool, cls: Any = EventSourceResponse) -> Any:
        if not timeout:
            return cls(gen, ping=0)
        return cls(gen, ping=0, send_timeout=10.0, shutdown_event=anyio.Event(), shutdown_grace_period=1.0)

    @api.get("/starlette")
    async def starlette(n: int, size: int) -> Any:
        return StreamingResponse(chunks(n, size)[0], media_type="text/event-stream")

    @api.get("/sse")
    async def bare(n: int, size: int) -> Any:
        return sse(chunks(n, size)[0], timeout=False)

    @api.get("/sse+timeout")
    async def timed(n: int, size: int) -> Any:
        return sse(chunks(n, size)[0], timeout=True)

    @api.get("/lith-timeout")
    async def lith_timed(n: int, size: int) -> Any:
        return sse(chunks(n, size)[0], timeout=True, cls=StreamResponse)

    class Feeder:
        """The hub's part: offers the next frame the moment the fan-out takes one, until `n` were
        taken."""

        def __init__(self, stream: Stream, n: int, frame: Frame) -> None:
            self.stream, self.left, self.frame = stream, n, frame

        def close(self, stream: Stream) -> None:
            pass

        def caught_up(self, keys: Any) -> None:
            self.left -= 1
            if self.left > 0:
                self.stream.offer(self.frame)
            else:
                asyncio.get_running_loop().call_soon(self.stream.end)

    def frame_of(size: int) -> Frame:
        """A frame whose event is `size` bytes, as long as the other layers' chunks."""
        padding = size - len(sse_event(Frame("k", "x")))
        return Frame("k", "x" * max(1, 1 + padding))

    @api.get("/lith")
    async def ours(n: int, size: int) -> Any:
        frame = frame_of(size)
        stream = Stream("t")
        subscription = Subscription(Feeder(stream, n, frame), stream, ("k",))
        stream.watch(subscription)
        stream.offer(frame)
        shutdown = anyio.Event()
        return StreamResponse(
            tab_body(subscription, IdentityEncoder(), shutdown, keepalive=15.0, hibernate_after=30.0),
            ping=0, send_timeout=10.0, shutdown_event=shutdown, shutdown_grace_period=1.0,
        )

    @api.post("/post", status_code=204)
    async def post(move: Move) -> None:
        return None

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/raw":
            q = dict(p.split("=") for p in scope["query_string"].decode().split("&"))
            gen, _ = chunks(int(q["n"]), int(q["size"]))
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            async for chunk in gen:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await api(scope, receive, send)

    return app


if os.environ.get("SEND_SERVER"):
    app = make_app()


# -- the client side -----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, http: str) -> None:
        self.port = free_port()
        env = {**os.environ, "SEND_SERVER": "1", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "send:app", "--app-dir", str(HERE), "--port", str(self.port),
             "--loop", "uvloop", "--http", http, "--no-access-log", "--log-level", "warning"],
            env=env,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


async def read_body(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    total = 0
    while data := await reader.read(1 << 20):
        total += len(data)
    writer.close()
    return total


async def stream_run(port: int, layer: str, chunks: int, conns: int, size: int) -> float:
    per = chunks // conns
    path = f"/{layer}?n={per}&size={size}"
    await asyncio.gather(*(read_body(port, path) for _ in range(conns)))  # nothing measured: warm
    return per * conns


async def post_run(port: int, posts: int, conns: int) -> None:
    body = json.dumps({"tab": "t1", "op": 1, "card_id": 7, "lane_id": 2, "position": 3}).encode()
    request = (
        b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Datastar-Request: true\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )

    async def one_conn(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(n):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 204"), head
        writer.close()

    await asyncio.gather(*(one_conn(posts // conns) for _ in range(conns)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--conns", type=int, default=20)
    parser.add_argument("--size", type=int, default=1_000, help="bytes per chunk")
    parser.add_argument("--posts", type=int, default=4_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    from conditions import load_average, print_conditions

    print_conditions(loop="server uvloop, client asyncio", sources=("fastapi_lith/engine/streams.py", "fastapi_lith/engine/fanout.py", "bench/send.py"))
    print(f"{args.chunks} chunks of {args.size} B over {args.conns} connections per run; "
          f"{args.posts} POSTs over {args.conns} keep-alive connections; {args.reps} rounds, layers interleaved\n")
    results: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    servers = {http: Server(http) for http in ("h11", "httptools")}
    try:
        for http, server in servers.items():  # warm up: imports, first requests
            for layer in LAYERS:
                asyncio.run(stream_run(server.port, layer, args.conns * 10, args.conns, args.size))
            asyncio.run(post_run(server.port, args.conns * 10, args.conns))
        for _ in range(args.reps):
            for http, server in servers.items():
                for layer in LAYERS:
                    before, started = cpu_seconds(server.proc.pid), time.perf_counter()
                    n = asyncio.run(stream_run(server.port, layer, args.chunks, args.conns, args.size))
                    wall = time.perf_counter() - started
                    results.setdefault(f"{http} {layer}", []).append((cpu_seconds(server.proc.pid) - before) / n * 1e6)
                    walls.setdefault(f"{http} {layer}", []).append(wall / n * 1e6)
                before, started = cpu_seconds(server.proc.pid), time.perf_counter()
                asyncio.run(post_run(server.port, args.posts, args.conns))
                wall = time.perf_counter() - started
                results.setdefault(f"{http} POST", []).append((cpu_seconds(server.proc.pid) - before) / args.posts * 1e6)
                walls.setdefault(f"{http} POST", []).append(wall / args.posts * 1e6)
    finally:
        for server in servers.values():
            server.close()

    def med(key: str) -> float:
        return statistics.median(results[key])

    print("| layer | h11 server CPU µs per chunk | added by the layer | httptools µs per chunk | added by the layer | httptools / h11 |")
    print("|---|---:|---:|---:|---:|---:|")
    previous: dict[str, float] = {}
    for layer in LAYERS:
        row = [layer]
        for http in ("h11", "httptools"):
            v = med(f"{http} {layer}")
            row += [f"{v:.1f}", f"{v - previous[http]:+.1f}" if http in previous else "–"]
            previous[http] = v
        row.append(f"{med('httptools ' + layer) / med('h11 ' + layer):.2f}×")
        print("| " + " | ".join(row) + " |")
    h11, ht = med("h11 POST"), med("httptools POST")
    print(f"| POST → 204 (per request) | {h11:.1f} | | {ht:.1f} | | {ht / h11:.2f}× |")
    print()
    print("Spread (min–max µs over the rounds): " + "; ".join(
        f"{k} {min(v):.1f}–{max(v):.1f}" for k, v in results.items()))
    print("Wall µs per chunk or POST (medians): " + "; ".join(
        f"{k} {statistics.median(v):.1f}" for k, v in walls.items()))
    print("load average at the end:", load_average())


if __name__ == "__main__":
    main()
