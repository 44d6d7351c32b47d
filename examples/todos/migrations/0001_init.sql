-- Who may sign in: a name and a scrypt hash of the password (never the password).
CREATE TABLE person (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE COLLATE NOCASE,
    salt BLOB NOT NULL,
    password_hash BLOB NOT NULL
);

-- Each todo belongs to one person: its owner is set by the server, never by the page.
CREATE TABLE todo (
    id INTEGER PRIMARY KEY,
    owner INTEGER NOT NULL REFERENCES person (id),
    title TEXT NOT NULL,
    done INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX todo_owner ON todo (owner, id);
