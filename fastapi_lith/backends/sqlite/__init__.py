"""SQLite: one file, WAL mode, one writer per process, readers on threads (see db.py, writer.py, feed.py)."""
