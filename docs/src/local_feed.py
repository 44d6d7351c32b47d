"""One process, no change feed: commits reach the hub in process only."""

from pathlib import Path

from fastapi_lith import Lith, LocalFeed

lith = Lith("app.db", migrations=Path(__file__).parent / "counter" / "migrations", feed=LocalFeed())
