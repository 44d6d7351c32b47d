CREATE TABLE clicks (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    total INTEGER NOT NULL
);
INSERT INTO clicks (id, total) VALUES (1, 0);
