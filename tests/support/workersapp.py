"""The counter example, each response naming the process that served it (`X-Pid`).

With `--workers N` the kernel hands each connection to one of the processes: the header tells
a test which process serves each of its streams and commands.
"""

from __future__ import annotations

import os
from typing import Any

from examples.counter.app import app as counter

PID = str(os.getpid()).encode()


class NamesProcess:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def named(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-pid", PID)]
            await send(message)

        await self.app(scope, receive, named if scope["type"] == "http" else send)


app = NamesProcess(counter)
