"""Virtual tabs for tests: many tabs, the real writer and hub, ticks on demand.

```python
async with Tabs(lith) as tabs:
    alice, bob = await tabs.open("counter"), await tabs.open("counter", "outcome/{tab}")
    await alice.do(Add(n=2, tab=alice.id))
    await tabs.tick()                    # render what changed, as the timer would
    assert ">2<" in bob.html("counter")  # every tab sees every other tab's command
```

No HTTP and no sleeping: each tick is explicit, so a test says exactly which commits share one.
"""

from __future__ import annotations

import itertools
from contextlib import AsyncExitStack
from typing import Any

from .engine.commands import Command
from .engine.frames import Frame
from .engine.streams import Principal, Stream
from .lith import Lith


class Tab:
    """One virtual browser tab: a stream of frames and the HTML it last received per view."""

    def __init__(self, tabs: Tabs, tab_id: str, principal: Principal = None) -> None:
        self.id = tab_id
        self.principal = principal
        self.stream = Stream(tab_id, principal)
        self.received: list[Frame] = []
        self._tabs = tabs
        self._html: dict[str, str] = {}

    def read(self) -> list[Frame]:
        """Take the frames waiting for this tab, as its HTTP response would."""
        frames = self.stream.take()
        self.received.extend(frames)
        for frame in frames:
            self._html[frame.key] = frame.html
        return frames

    def html(self, key: str) -> str:
        """The newest HTML this tab holds for a view instance (reading what waits first)."""
        self.read()
        return self._html[key.replace("{tab}", self.id).replace("{principal}", str(self.principal))]

    async def do(self, cmd: Command) -> Any:
        """Send a command through the real writer, as this tab's POST would."""
        return await self._tabs.lith.writer.do(cmd)

    def close(self) -> None:
        self._tabs.lith.hub.close(self.stream)


class Tabs:
    """An app's lifespan with the hub's timer off, and a factory of virtual tabs."""

    def __init__(self, lith: Lith) -> None:
        self.lith = lith
        self._ids = itertools.count(1)
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Tabs:
        await self._stack.enter_async_context(self.lith.lifespan(ticks=False))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def open(self, *keys: str, tab: str | None = None, principal: Principal = None) -> Tab:
        """A new tab watching view instances, their first frames read; `{tab}` is its id and
        `{principal}` who it is signed in as (the hub checks `{principal}` views and `access`
        rules as for a stream; None is nobody)."""
        new = Tab(self, tab or f"tab-{next(self._ids)}", principal)
        await self.lith.hub.open(
            new.stream, [k.replace("{tab}", new.id).replace("{principal}", str(principal)) for k in keys]
        )
        new.read()
        return new

    async def do(self, cmd: Command) -> Any:
        return await self.lith.writer.do(cmd)

    async def tick(self) -> int:
        """One tick: render every dirty instance some tab can take; returns how many rendered."""
        return await self.lith.hub.tick()
