"""PostgreSQL: one database for several hosts (psycopg 3)."""
