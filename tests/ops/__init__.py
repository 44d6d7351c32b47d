"""Operations (fastapi_lith/ops/): backup, restore and replication of real SQLite files."""
