"""Stream connects: what a connect costs without an identity, and with one and a signed token.

Two example apps, each its own uvicorn with the deploy's flags:

  public   the counter example: no identity, no secret; `views=counter,outcome/{tab}`
  signed   the todos example: `Lith(identity=signed_in, secret=...)`; a person signed up once,
           their page's stream URL (`todos/{principal}`, `everyone`, `outcome/{tab}`) with its
           token, opened with their session cookie, so every connect runs the session's
           identity, checks the token and the `{principal}` view

A connect is: open the TCP connection, send the GET, read until the first
`datastar-patch-elements` event (every view's first frame), close. C clients connect one after
another, N connects in all, after a warm-up. Figures: connects per second and the server's CPU
per connect. A tab's stream in either app reuses one tab id, so every connect renders nothing
new: the figure is the connect path itself.

With `--against REV` the public app runs over both libraries; the signed one needs this
version's identity (its figures are nan over an older library).

    python -m bench.connects                     # 2,000 connects, 8 at a time, each app
    python -m bench.connects --quick --against 04a66af
"""

from __future__ import annotations

import argparse
import asyncio
import html
import re
import tempfile
import time
from pathlib import Path

import httpx

from .lib import client, harness
from .lib.proc import Usage
from .lib.server import Server

STREAM_URL = re.compile(r"@get\('([^']+)'")


def signed_in(port: int) -> tuple[str, str]:
    """A new person's session cookie and their page's stream path, token included."""
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, headers={"Sec-Fetch-Site": "same-origin"}, timeout=30) as browser:
        browser.post("/signup", data={"name": "bench", "password": "a bench password"})
        page = browser.get("/")
        match = STREAM_URL.search(html.unescape(page.text))
        if match is None:
            raise RuntimeError(f"no stream URL on the todos page: {page.status_code} {page.text[:200]}")
        return "; ".join(f"{k}={v}" for k, v in browser.cookies.items()), match.group(1)


async def connect(port: int, path: str, cookie: str) -> None:
    first = asyncio.get_running_loop().create_future()

    def on_event(stream: client.SseStream, event: bytes, at: float) -> None:
        if b"datastar-patch-elements" in event and not first.done():
            first.set_result(None)

    stream = await client.open_stream(port, path, "identity", on_event, cookie=cookie)
    try:
        await asyncio.wait_for(first, 30)
    finally:
        stream.close()


async def connects(port: int, path: str, cookie: str, total: int, clients: int) -> int:
    left = total

    async def one_client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await connect(port, path, cookie)

    await asyncio.gather(*(one_client() for _ in range(clients)))
    return total


def run_app(kind: str, total: int, clients: int, tmp: Path) -> dict[str, float]:
    tmp.mkdir()
    if kind == "public":
        server = Server("examples.counter.app:app", env={"COUNTER_DB": str(tmp / "counter.db")}, access_log=False)
    else:
        server = Server("examples.todos.app:app", ready="/signin", access_log=False,
                        env={"TODOS_DB": str(tmp / "todos.db"), "TODOS_SECRET": "a secret for the bench alone"})
    try:
        server.start()
    except RuntimeError:
        if kind == "signed":  # a library from before identities: no todos example to serve
            return {"connects_s": float("nan"), "cpu_ms": float("nan")}
        raise
    try:
        if kind == "public":
            cookie, path = "", "/lith/stream?views=counter,outcome/bench&tab=bench"
        else:
            cookie, path = signed_in(server.port)
        client.run(connects(server.port, path, cookie, max(10, total // 10), clients))  # warm-up
        before, began = Usage.of(server.pid), time.perf_counter()
        done = client.run(connects(server.port, path, cookie, total, clients))
        seconds, after = time.perf_counter() - began, Usage.of(server.pid)
    finally:
        server.close()
    return {"connects_s": done / seconds, "cpu_ms": (after.cpu - before.cpu) / done * 1000}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--connects", type=int, default=2000, help="connects per app and run")
    ap.add_argument("--clients", type=int, default=8, help="clients connecting at once")


def measure(args: argparse.Namespace) -> harness.Result:
    total = 20 if args.smoke else 500 if args.quick else args.connects
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="lith-bench-connects-") as tmp:
        for kind in ("public", "signed"):
            row = run_app(kind, total, args.clients, Path(tmp) / kind)
            figures |= {f"{kind}_{name}": value for name, value in row.items()}
    text = "\n".join([
        f"{total} connects per app, {args.clients} clients at once, each to its first frame:\n",
        "| app | connects/s | server ms CPU per connect |", "|---|---:|---:|",
        *(f"| {kind} | {figures[f'{kind}_connects_s']:.0f} | {figures[f'{kind}_cpu_ms']:.2f} |"
          for kind in ("public", "signed")),
    ])
    return harness.Result(figures, text)


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments)
