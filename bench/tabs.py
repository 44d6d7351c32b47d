"""Thousands of real tabs on one server: opening, memory, a broadcast, and the deploy storm.

One raw asyncio client on uvloop (bench/lib/tabs.py) opens N real SSE streams (zstd) to the
counter example (bench/lib/tabsapp.py: the example, a per-tab view and a command that moves
no other tab), decodes every stream, and timestamps each change per tab. Two variants: every
tab watches the shared `counter` view (`shared`), or a view of its own rendered for it at each
change (`pertab`); each tab also watches its outcome, as the example's page does.

Per N it reports, all measured on the N streams:

  open       seconds from the first connect until every tab has its headers, and its first frame
  RSS/tab    server RSS growth per tab, awake (compressors held) and hibernated
  broadcast  one change's latency per tab after its POST's 204, p50/p95/p99, over several
             rounds (missed: tabs that never got it), with a POST that moves no tab sent every
             20 ms meanwhile (its 204 p95), and the server's CPU per delivered frame
  storm      SIGTERM with N tabs open, start again (same port): each tab reconnects as
             Datastar 1.0 does (the stream's `retry:`, doubled after each refused try); seconds
             after the new process's first answer (the first tab's headers, or the GET that
             polls for it) until each tab is back and current (p50/p95/max), 5xx
             answers, connects refused after the port answered, SYNs the kernel dropped for a
             full listen queue (machine-wide: other programs' count too), the new process's peak RSS
             against the old one's steady RSS, and the latency of changes made during the storm
             (one a second) at the tabs already back: are the first tabs back starved?
             Two ways to listen, interleaved (`--listen`): `bound`, uvicorn binds the port
             itself, so it refuses connects while no process runs; `held`, this process holds
             the socket and hands it to each uvicorn as `--fd`, as deploy/lith@.socket does, so
             a connect meanwhile waits in its queue.

    python -m bench.tabs                        # 1,000, 5,000 and 10,000 tabs, both variants
    python -m bench.tabs --tabs 2000 --variants shared --storms 3   # each way 3 times, interleaved
    python -m bench.tabs --tabs 1000,2000 --variants shared
    python -m bench.tabs --quick                # 1,000 tabs, shared, shorter
    python -m bench.tabs --tabs 10000 --variants shared --no-storm --profile 20   # where the broadcast goes
    python -m bench.tabs --tabs 10000 --variants shared --listen bound --serving uvicorn,granian
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .lib import client, harness
from .lib.proc import Usage, Window
from .lib.profile import Spy
from .lib.server import SERVING, Server
from .lib.stats import median, number, percentile
from .lib.tabs import COUNTER, MINE, Herd, listen_limits, listen_overflows, raise_file_limit

VARIANTS = {
    "shared": "/lith/stream?views=counter,outcome/{tab}&tab={tab}",
    "pertab": "/lith/stream?views=mine/{tab},outcome/{tab}&tab={tab}",
}
LISTEN = ("bound", "held")
PROBE_EVERY = 0.02  # seconds between the POSTs that read the server's responsiveness
# Seconds between the changes made while the storm comes back: a change costs a frame at every
# tab already back (a render each in the per-tab variant), so more would measure the changes.
STORM_CHANGE_EVERY = 1.0
STORM_FIGURES = ("all_back", "stop_s", "start_s", "back_p50_s", "back_p95_s", "back_max_s", "reconnected_max_s",
                 "fivexx", "refused_after", "listen_overflows", "failed", "refused_before", "peak_over_steady",
                 "during_p95_ms", "during_n")


async def probe(herd: Herd, until: asyncio.Event, answers: list[float]) -> None:
    """POST /note (it moves only the poster's own outcome) every PROBE_EVERY s: its 204 times."""
    poster = await client.Poster.connect(herd.port)
    op = 0
    try:
        while not until.is_set():
            op += 1
            sent = time.perf_counter()
            status = await asyncio.wait_for(poster.post("/note", b'{"tab": "probe", "op": %d}' % op), 30)
            if status == 204:
                answers.append(time.perf_counter() - sent)
            try:
                await asyncio.wait_for(until.wait(), PROBE_EVERY)
            except TimeoutError:
                pass
    finally:
        poster.close()


async def broadcast(herd: Herd, rounds: int, pid: int, profile: float = 0.0) -> dict[str, Any]:
    """`rounds` changes, one after another, each awaited at every tab; with `profile`, py-spy
    over the server meanwhile, the changes going on until its window of that many seconds ends."""
    n = len(herd.tabs)
    stop, answers = asyncio.Event(), list[float]()
    prober = asyncio.create_task(probe(herd, stop, answers))
    latencies: list[float] = []
    missed = 0
    window = Window.open(pid)
    frames_before = herd.frames
    spy = Spy(pid, profile) if profile else None
    began, client_began = time.perf_counter(), time.process_time()
    done = 0
    while done < rounds or time.perf_counter() - began < profile:
        done += 1
        value = max(t.latest for t in herd.tabs) + 1
        herd.watch(value)
        status, answered = await herd.post("/add", {"n": 1})
        assert status == 204, f"POST /add answered {status}"
        await herd.until(lambda h: h.current >= n, 60)
        latencies += herd.latencies(value, answered)
        missed += herd.missed(value)
    cost = window.close()
    client_seconds = time.process_time() - client_began
    frames = herd.frames - frames_before
    stop.set()
    await prober
    if spy is not None:
        summary = await asyncio.to_thread(spy.summary)
        print(f"\nprofile of the server, {n} tabs, {done} changes ({spy.command}):\n{summary}\n",
              file=sys.stderr, flush=True)
    return {"latencies": latencies, "missed": missed, "post_p95_ms": percentile(answers, 95) * 1000,
            "cpu_us_per_frame": cost.cores * cost.seconds / max(1, frames) * 1e6, "cores": cost.cores,
            "client_us_per_frame": client_seconds / max(1, frames) * 1e6, "frames": frames}


async def storm(herd: Herd, server: Server) -> dict[str, Any]:
    """SIGTERM, start again on the same port, and watch every tab come back."""
    n = len(herd.tabs)
    steady = Usage.of(server.pid).rss
    overflows = listen_overflows()
    terminated = time.perf_counter()
    await asyncio.to_thread(server.stop, signal.SIGTERM)
    exited = time.perf_counter()
    value = max(t.latest for t in herd.tabs) + 1
    herd.watch(value)
    starting = asyncio.ensure_future(asyncio.to_thread(server.start))
    # The change the tabs must show is made as soon as the new process takes it: on a held
    # socket its POST waits in the queue, on a bound port it is refused until the port opens.
    # (Waiting for `start` first would put it behind the GET that `start` polls with, which on
    # a held socket waits behind every tab that reconnected meanwhile.)
    while True:
        try:
            status, first_204 = await herd.post("/add", {"n": 1})
            break
        except ConnectionRefusedError:
            await asyncio.sleep(0.05)  # polling a port that is not yet open, as `start` does
    assert status == 204, f"POST /add answered {status} after the restart"
    await starting
    polled = time.perf_counter()  # the page's GET answered (within its 50 ms poll)
    changes: list[tuple[int, float, float]] = []  # (value, sent, 204) made during the storm
    failed_before = herd.failures()

    async def ticker() -> None:
        while herd.current < n:
            await herd.until(lambda h: h.current >= n, STORM_CHANGE_EVERY)
            if herd.current >= n:
                return
            sent = time.perf_counter()
            status, at = await herd.post("/add", {"n": 1})
            assert status == 204, f"POST /add answered {status} during the storm"
            changes.append((value + 1 + len(changes), sent, at))

    ticking = asyncio.create_task(ticker())
    done = await herd.until(lambda h: h.current >= n, 120)
    ticking.cancel()
    await asyncio.gather(ticking, return_exceptions=True)
    # The new process's first answer: the page's GET, the change's 204 or a tab's headers,
    # whichever came first.
    answered = min([polled, first_204, *(at for t in herd.tabs for at in t.connected_at if at > exited)])
    back = [b for b in (t.reached_at(value) - answered for t in herd.tabs) if b == b]
    reconnected = [t.connected_at[-1] - answered for t in herd.tabs if t.connected_at]
    during: list[float] = []
    for v, sent, at in changes:  # changes made while others were still coming back
        already = [t for t in herd.tabs if t.connected_at and t.connected_at[-1] < sent]
        during += herd.latencies(v, at, already)
    statuses = herd.statuses()
    return {
        "all_back": done, "stop_s": exited - terminated, "start_s": answered - exited,
        "back_p50_s": percentile(back, 50), "back_p95_s": percentile(back, 95),
        "back_max_s": max(back, default=float("nan")),
        "reconnected_max_s": max(reconnected, default=float("nan")),
        "fivexx": sum(c for s, c in statuses.items() if s >= 500), "refused_after": herd.refused(answered),
        "listen_overflows": listen_overflows() - overflows,
        "failed": sum(herd.failures().values()) - sum(failed_before.values()),
        "failures": {k: v - failed_before.get(k, 0) for k, v in herd.failures().items()},
        "refused_before": herd.refused(terminated) - herd.refused(answered),
        "peak_over_steady": Usage.of(server.pid).hwm / steady if steady else float("nan"),
        "during_p95_ms": percentile(during, 95) * 1000, "during_n": len(changes),
    }


async def run_size(variant: str, n: int, rounds: int, hibernate_after: float, workers: int,
                   tmp: Path, listen: str, profile: float, restart: bool, serving: str = "uvicorn") -> dict[str, float]:
    db = tmp / f"{variant}-{n}-{listen}-{serving}.db"
    server = Server("bench.lib.tabsapp:app", env={"COUNTER_DB": str(db), "TABS_HIBERNATE_AFTER": str(hibernate_after)},
                    workers=workers, access_log=False, held=listen == "held",
                    serving=serving)
    await asyncio.to_thread(server.start)
    herd = Herd(server.port, VARIANTS[variant], COUNTER if variant == "shared" else MINE, encoding="zstd")
    try:
        before = Usage.of(server.pid).rss
        started = time.perf_counter()
        opening = asyncio.ensure_future(herd.open(n, timeout=300))
        await herd.until(lambda h: h.connected >= n, 300)
        connected_s = time.perf_counter() - started
        first_frame_s = await opening
        awake = Usage.of(server.pid).rss
        cast = await broadcast(herd, rounds, server.pid, profile)
        asleep = float("nan")
        if await herd.until(lambda h: h.asleep >= n, hibernate_after + 60):
            asleep = Usage.of(server.pid).rss
        woken = await broadcast(herd, 1, server.pid)
        gone = await storm(herd, server) if restart else {**dict.fromkeys(STORM_FIGURES, float("nan")), "failures": {}}
    finally:
        await herd.close()
        await asyncio.to_thread(server.close)
        db.unlink(missing_ok=True)
    print(f"{variant}, {n} tabs, {listen}, {serving}, the storm's other failed fetches: {gone['failures'] or 'none'}; "
          f"statuses other than 200: {herd.statuses() or 'none'}", file=sys.stderr, flush=True)
    lat = cast["latencies"]
    return {
        "connected_s": connected_s, "first_frame_s": first_frame_s,
        "awake_kib": (awake - before) / n / 1024, "asleep_kib": (asleep - before) / n / 1024,
        **{f"p{q}_ms": percentile(lat, q) * 1000 for q in (50, 95, 99)},
        "missed": cast["missed"] + woken["missed"], "wake_p95_ms": percentile(woken["latencies"], 95) * 1000,
        "post_p95_ms": cast["post_p95_ms"], "cpu_us_per_frame": cast["cpu_us_per_frame"],
        "client_us_per_frame": cast["client_us_per_frame"],
        **{f"storm_{k}": float(v) for k, v in gone.items() if k != "failures"},
    }


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tabs", default="1000,5000,10000", help="tab counts, comma-separated")
    ap.add_argument("--variants", default="shared,pertab", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--broadcasts", type=int, default=5, help="changes awaited at every tab, per size")
    ap.add_argument("--hibernate-after", type=float, default=5.0, help="the server's hibernate_after, s")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn --workers (RSS and CPU: the whole tree)")
    ap.add_argument("--listen", default="bound,held", help=f"of {', '.join(LISTEN)}, interleaved")
    ap.add_argument("--serving", default="uvicorn",
                    help=f"of {', '.join(SERVING)}, interleaved (granian binds its own port: bound only)")
    ap.add_argument("--storms", type=int, default=1, help="runs of each size and way, interleaved (medians shown)")
    ap.add_argument("--no-storm", action="store_true", help="open and broadcast only: no restart")
    ap.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                    help="py-spy over the server for this long during the broadcasts (changes go on meanwhile)")


def measure(args: argparse.Namespace) -> harness.Result:
    listens, storms = args.listen.split(","), args.storms
    if args.no_storm:  # the two ways differ only in the storm
        listens = listens[:1]
    ways = [(listen, serving) for listen in listens for serving in args.serving.split(",")
            if not (listen == "held" and serving == "granian")]
    if args.smoke:
        sizes, variants, rounds, hibernate = [50], ["shared"], 2, 1.0
    elif args.quick:
        sizes, variants, rounds, hibernate = [1000], ["shared"], 3, 2.0
    else:
        sizes = [int(x) for x in args.tabs.split(",")]
        variants, rounds, hibernate = args.variants.split(","), args.broadcasts, args.hibernate_after
    soft, hard = raise_file_limit()
    limits = listen_limits()
    runs: dict[str, list[dict[str, float]]] = {}
    own = Window.open()
    with tempfile.TemporaryDirectory(prefix="lith-bench-tabs-") as tmp:
        for variant in variants:
            for n in sizes:
                for _ in range(storms):
                    for listen, serving in ways:  # interleaved: a busy spell on the machine costs each way
                        began = time.perf_counter()
                        row = client.run(run_size(variant, n, rounds, hibernate, args.workers, Path(tmp), listen,
                                                          args.profile, not args.no_storm, serving))
                        way = listen if serving == "uvicorn" else f"{listen}_{serving}"
                        runs.setdefault(f"{variant}_{n}_{way}", []).append(row)
                        print(f"{variant}, {n} tabs, {way}: {time.perf_counter() - began:.0f} s; storm back p95 "
                              f"{row['storm_back_p95_s']:.2f} s, max {row['storm_back_max_s']:.2f} s, refused "
                              f"{row['storm_refused_before'] + row['storm_refused_after']:.0f}",
                              file=sys.stderr, flush=True)
    mine = own.close()
    rows = {key: {name: median([r[name] for r in got]) for name in got[0]} for key, got in runs.items()}
    for key, got in runs.items():  # every run's tabs back, or not
        rows[key]["storm_all_back"] = min(r["storm_all_back"] for r in got)
    figures = {f"{key}_{name}": value for key, row in rows.items() for name, value in row.items()}
    text = [
        f"open files: {soft} (hard {hard}); listen queue: uvicorn --backlog 16384, kernel caps "
        + ", ".join(f"{k} {v}" for k, v in limits.items()),
        f"zstd; {rounds} broadcasts per size, a POST that moves no tab every {PROBE_EVERY * 1000:.0f} ms meanwhile; "
        f"hibernate_after {hibernate:g} s; {args.workers} uvicorn worker(s); "
        f"this client used {mine.cores:.2f} cores on average; each row the median of {storms} run(s)\n",
        "| tabs | connected s | first frame s | KiB/tab awake | KiB/tab asleep | p50 ms | p95 ms | p99 ms "
        "| missed | after wake p95 ms | POST 204 p95 ms | server µs CPU/frame | client µs CPU/frame |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in rows.items():
        text.append(
            f"| {key} | {r['connected_s']:.2f} | {r['first_frame_s']:.2f} | {number(r['awake_kib'], 1)} "
            f"| {number(r['asleep_kib'], 1)} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['p99_ms']:.0f} "
            f"| {r['missed']:.0f} | {r['wake_p95_ms']:.0f} | {r['post_p95_ms']:.1f} | {r['cpu_us_per_frame']:.1f} "
            f"| {r['client_us_per_frame']:.1f} |")
    if args.no_storm:
        return harness.Result(figures, "\n".join(text), {"rows": rows, "runs": runs})
    text += [
        "\nThe storm: SIGTERM with every tab open, start again; seconds after the new process's first answer. "
        "bound: uvicorn binds the port; held: the socket outlives the process (deploy/lith@.socket).\n",
        "| tabs | stop s | start s | all back | back p50 s | p95 s | max s | last reconnect s | 5xx "
        "| refused after | refused while down | SYNs dropped, queue full | peak/steady RSS "
        "| change p95 ms at tabs back (n) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in rows.items():
        text.append(
            f"| {key} | {r['storm_stop_s']:.1f} | {r['storm_start_s']:.1f} | {'yes' if r['storm_all_back'] else 'NO'} "
            f"| {r['storm_back_p50_s']:.2f} | {r['storm_back_p95_s']:.2f} | {r['storm_back_max_s']:.2f} "
            f"| {r['storm_reconnected_max_s']:.2f} | {r['storm_fivexx']:.0f} | {r['storm_refused_after']:.0f} "
            f"| {r['storm_refused_before']:.0f} | {r['storm_listen_overflows']:.0f} "
            f"| {r['storm_peak_over_steady']:.2f} "
            f"| {number(r['storm_during_p95_ms'])} ({r['storm_during_n']:.0f}) |")
    return harness.Result(figures, "\n".join(text), {"rows": rows, "runs": runs})


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments)
