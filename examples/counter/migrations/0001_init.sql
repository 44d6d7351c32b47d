CREATE TABLE counter (
    id INTEGER PRIMARY KEY,
    count INTEGER NOT NULL
);
INSERT INTO counter (id, count) VALUES (1, 0);

-- What each tab's last command did, for its per-tab view.
CREATE TABLE outcome (
    tab TEXT PRIMARY KEY,
    op INTEGER NOT NULL,
    message TEXT NOT NULL
);
