"""The send path: what one SSE chunk costs the server, layer by layer, and one POST, h11 and httptools.

A real uvicorn (the deploy's flags, `--http h11` or `httptools`) serves this module's `app`; the
client in this process reads the bodies over 127.0.0.1 and posts. The figure is the server's
CPU (every thread, /proc) over each run divided by the chunks or POSTs it served; the layers
take turns in each round and the medians are printed.

Layers, each adding one thing to the one above:
  raw           a bare ASGI app: one `send` per chunk
  starlette     Starlette's StreamingResponse over an async generator
  sse           sse-starlette's EventSourceResponse, no ping, no send timeout
  sse+timeout   the same with a send timeout and a shutdown event (an AnyIO cancel scope per send)
  lith-timeout  the library's `StreamResponse` instead: the request's own task, one watchdog timer for its sends
  lith          the library's stream body: frames offered to a `Stream`, encoded (identity) by
                the fan-out, written by the tab's body inside `StreamResponse`; a frame is
                offered as soon as the previous one is taken
POST: a FastAPI route validating a small JSON body into a Pydantic model, answering 204.
The two library layers have no public name: bench/lib/layers.py, the one bench module that
imports private ones, builds them (it says why).

    python -m bench.send                 # about a minute
    python -m bench.send --chunks 20000 --conns 20 --posts 4000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from pydantic import BaseModel

from .lib import harness
from .lib.proc import Usage
from .lib.server import Server
from .lib.stats import median, ratio

LAYERS = ("raw", "starlette", "sse", "sse+timeout", "lith-timeout", "lith")


class Move(BaseModel):
    """The kanban example's move, as its page posts it."""

    tab: str
    op: int
    card_id: int
    lane_id: int
    position: int


def make_app() -> Any:
    """The server's app; built only in the server process (SEND_SERVER set)."""
    import anyio
    from fastapi import FastAPI
    from sse_starlette import EventSourceResponse
    from starlette.responses import PlainTextResponse, StreamingResponse

    from .lib.layers import tab_response, timed_response

    api = FastAPI()

    def chunks(n: int, size: int) -> Any:
        chunk = b"data: " + b"x" * max(0, size - 8) + b"\n\n"

        async def gen() -> Any:
            for _ in range(n):
                yield chunk

        return gen()

    def sse(gen: Any, timeout: bool) -> Any:
        if not timeout:
            return EventSourceResponse(gen, ping=0)
        return EventSourceResponse(gen, ping=0, send_timeout=10.0, shutdown_event=anyio.Event(),
                                   shutdown_grace_period=1.0)

    api.get("/")(lambda: PlainTextResponse("ok"))
    api.get("/starlette")(lambda n, size: StreamingResponse(chunks(n, size), media_type="text/event-stream"))
    api.get("/sse")(lambda n, size: sse(chunks(n, size), timeout=False))
    api.get("/sse+timeout")(lambda n, size: sse(chunks(n, size), timeout=True))
    api.get("/lith-timeout")(lambda n, size: timed_response(chunks(n, size)))

    @api.get("/lith")
    async def ours(n: int, size: int) -> Any:
        return tab_response(n, size)

    @api.post("/post", status_code=204)
    async def post(move: Move) -> None:
        return None

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/raw":
            q = dict(p.split("=") for p in scope["query_string"].decode().split("&"))
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for chunk in chunks(int(q["n"]), int(q["size"])):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await api(scope, receive, send)

    return app


if os.environ.get("SEND_SERVER"):
    app = make_app()


async def read_bodies(port: int, layer: str, per: int, conns: int, size: int) -> None:
    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        writer.write(f"GET /{layer}?n={per}&size={size} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        while await reader.read(1 << 20):
            pass
        writer.close()

    await asyncio.gather(*(one() for _ in range(conns)))


async def post_all(port: int, per: int, conns: int) -> None:
    body = json.dumps({"tab": "t1", "op": 1, "card_id": 7, "lane_id": 2, "position": 3}).encode()
    request = (b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nDatastar-Request: true\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(per):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 204"), head
        writer.close()

    await asyncio.gather(*(one() for _ in range(conns)))


def cpu_us_per(server: Server, n: int, coro: Any) -> float:
    before = Usage.of(server.pid).cpu
    asyncio.run(coro)
    return (Usage.of(server.pid).cpu - before) / n * 1e6


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--chunks", type=int, default=20_000)
    ap.add_argument("--conns", type=int, default=20)
    ap.add_argument("--size", type=int, default=1_000, help="bytes per chunk")
    ap.add_argument("--posts", type=int, default=4_000)
    ap.add_argument("--reps", type=int, default=5, help="rounds of every layer (medians)")


def measure(args: argparse.Namespace) -> harness.Result:
    chunks, posts, reps = (400, 100, 1) if args.smoke else (10_000, 2_000, 3) if args.quick \
        else (args.chunks, args.posts, args.reps)
    conns = args.conns
    runs: dict[str, list[float]] = {}
    https = ("httptools",) if args.smoke else ("h11", "httptools")
    servers = {http: Server("bench.send:app", env={"SEND_SERVER": "1"}, access_log=False, http=http).start()
               for http in https}
    try:
        for server in servers.values():  # warm: imports, first requests
            for layer in LAYERS:
                asyncio.run(read_bodies(server.port, layer, 10, conns, args.size))
            asyncio.run(post_all(server.port, 10, conns))
        for _ in range(reps):
            for http, server in servers.items():
                for layer in LAYERS:
                    bodies = read_bodies(server.port, layer, chunks // conns, conns, args.size)
                    runs.setdefault(f"{http} {layer}", []).append(cpu_us_per(server, chunks // conns * conns, bodies))
                runs.setdefault(f"{http} POST", []).append(
                    cpu_us_per(server, posts // conns * conns, post_all(server.port, posts // conns, conns)))
    finally:
        for server in servers.values():
            server.stop()
    med = {k: median(v) for k, v in runs.items()}
    lines = [f"{chunks} chunks of {args.size} B over {conns} connections per run; {posts} POSTs over {conns} "
             f"keep-alive connections; {reps} rounds. Server CPU µs per chunk (or POST), medians (min–max):\n",
             "| layer | " + " | ".join(f"{h} | added" for h in https) + " | httptools / h11 |",
             "|---|" + "---:|---:|" * len(https) + "---:|"]
    previous: dict[str, float] = {}
    for layer in (*LAYERS, "POST"):
        row = [layer]
        for http in https:
            v, vs = med[f"{http} {layer}"], runs[f"{http} {layer}"]
            row += [f"{v:.1f} ({min(vs):.1f}–{max(vs):.1f})",
                    f"{v - previous[http]:+.1f}" if http in previous and layer != "POST" else "–"]
            previous[http] = v
        row.append(f"{ratio(med['httptools ' + layer], med['h11 ' + layer]):.2f}×" if len(https) == 2 else "")
        lines.append("| " + " | ".join(row) + " |")
    figures = {f"{k.replace(' ', '_')}_us": v for k, v in med.items() if k.startswith("httptools")}
    if "h11 POST" in med:
        figures["h11_POST_us"] = med["h11 POST"]
    return harness.Result(figures, "\n".join(lines), {"runs": runs})


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments)
