CREATE TABLE counter (
    id integer PRIMARY KEY,
    count integer NOT NULL
);
INSERT INTO counter (id, count) VALUES (1, 0);

-- What each tab's last command did, for its per-tab view.
CREATE TABLE outcome (
    tab text PRIMARY KEY,
    op integer NOT NULL,
    message text NOT NULL
);
