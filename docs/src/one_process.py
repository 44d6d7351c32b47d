"""One process only: the in-process feed, with no feed rows, no lock file and no polling."""

from pathlib import Path

# --8<-- [start:feed]
from fastapi_lith import Lith, LocalFeed

lith = Lith("app.db", migrations=Path(__file__).parent / "counter" / "migrations", feed=LocalFeed())
# --8<-- [end:feed]
