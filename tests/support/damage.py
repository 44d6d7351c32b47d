"""Damaged databases: an index out of step with its table (the damage `integrity_check` finds and
`quick_check` does not, made as it happens, with rows changed while SQLite could not see the
index), and a file changed on the disk between its writing and its next reading.
"""

from __future__ import annotations

import ctypes
import fnmatch
import os
import select
import sqlite3
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest


def index_out_of_step(path: Path, *, rows: int = 200, changed: int = 25) -> None:
    """Table `card` with index `card_lane`: its first `changed` rows moved to lane 'done' while
    the index still holds them under 'todo'."""
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(
            "CREATE TABLE card (id INTEGER PRIMARY KEY, title TEXT, lane TEXT);"
            "CREATE INDEX card_lane ON card (lane);"
        )
        conn.executemany("INSERT INTO card (title, lane) VALUES (?, ?)", [(f"t{i}", "todo") for i in range(rows)])
        conn.commit()
        index = conn.execute("SELECT * FROM sqlite_schema WHERE name = 'card_lane'").fetchone()
        conn.execute("PRAGMA writable_schema = ON")  # hide the index from SQLite for a moment
        conn.execute("DELETE FROM sqlite_schema WHERE name = 'card_lane'")
        conn.commit()
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE card SET lane = 'done' WHERE id <= ?", (changed,))  # the index keeps 'todo'
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("INSERT INTO sqlite_schema VALUES (?, ?, ?, ?, ?)", index)
        conn.commit()


# fanotify(7): the kernel holds each open of a watched file until the listener answers, and
# hands it a descriptor of its own that raises no event: the file can be changed in between.
_FAN_CLASS_CONTENT, _FAN_CLOEXEC = 0x04, 0x01
_FAN_MARK_ADD, _FAN_OPEN_PERM, _FAN_EVENT_ON_CHILD, _FAN_ALLOW = 0x01, 0x00010000, 0x08000000, 0x01
_EVENT = struct.Struct("<IBBHQii")  # struct fanotify_event_metadata
_AT_FDCWD = -100


@contextmanager
def changed_on_disk(folder: Path, pattern: str, change: Callable[[int], None]) -> Iterator[list[str]]:
    """Within the block, the first time a file of `folder` whose name matches `pattern` is
    opened with bytes in it, `change(fd)` alters it before the opener reads a byte: a disk that
    stored something else than it was given. Yields the names of the files changed. Skipped
    where fanotify cannot be used (it needs root, as CI has)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
    fan = libc.fanotify_init(_FAN_CLASS_CONTENT | _FAN_CLOEXEC, os.O_RDWR)
    if fan < 0:
        pytest.skip(f"fanotify cannot be used here: {os.strerror(ctypes.get_errno())}")
    changed: list[str] = []
    stop_r, stop_w = os.pipe()

    def answer() -> None:
        while True:
            ready, _, _ = select.select([fan, stop_r], [], [])
            if stop_r in ready:
                return
            data = os.read(fan, 4096)
            for at in range(0, len(data), _EVENT.size):
                fd = _EVENT.unpack_from(data, at)[5]
                try:
                    name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
                    if not changed and fnmatch.fnmatch(name, pattern) and os.fstat(fd).st_size > 0:
                        change(fd)
                        changed.append(name)
                finally:  # every open waits for its answer, whatever happened here
                    os.write(fan, struct.pack("<iI", fd, _FAN_ALLOW))
                    os.close(fd)

    listener = threading.Thread(target=answer, name="changed-on-disk", daemon=True)
    try:
        if libc.fanotify_mark(fan, _FAN_MARK_ADD, _FAN_OPEN_PERM | _FAN_EVENT_ON_CHILD, _AT_FDCWD, os.fsencode(folder)):
            pytest.skip(f"fanotify cannot watch {folder}: {os.strerror(ctypes.get_errno())}")
        listener.start()
        yield changed
    finally:
        os.write(stop_w, b"x")
        if listener.is_alive():
            listener.join()
        for fd in (fan, stop_r, stop_w):
            os.close(fd)
