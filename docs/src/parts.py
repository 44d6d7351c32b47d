"""An app's own parts: a writer built by the test, one reader thread, a hub that ticks fast."""

from pathlib import Path

from fastapi_lith import Hub, Lith, Readers, Writer

MIGRATIONS = Path(__file__).parent / "counter" / "migrations"


def make_lith(path: Path) -> Lith:
    writer = Writer(path, migrations=MIGRATIONS, batch_size=1)   # its settings are its own
    readers = Readers(path, size=1)                               # opened and closed by the caller
    return Lith(path, writer=writer, readers=readers, hub=Hub, tick=0.01)
