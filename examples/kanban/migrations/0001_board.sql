-- Boards hold lanes, lanes hold cards; positions order them (0, 1, 2, ... within a parent).
CREATE TABLE board (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL
);

CREATE TABLE lane (
    id INTEGER PRIMARY KEY,
    board_id INTEGER NOT NULL REFERENCES board (id) ON DELETE CASCADE,
    title TEXT NOT NULL,
    position INTEGER NOT NULL
);
CREATE INDEX lane_by_board ON lane (board_id, position);

CREATE TABLE card (
    id INTEGER PRIMARY KEY,
    lane_id INTEGER NOT NULL REFERENCES lane (id) ON DELETE CASCADE,
    title TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    position INTEGER NOT NULL
);
CREATE INDEX card_by_lane ON card (lane_id, position);

-- What each tab's last command did: the tab's outcome view shows it, and `op` tells the page
-- which of its requests has landed (a button stays pending until then).
CREATE TABLE outcome (
    tab TEXT PRIMARY KEY,
    op INTEGER NOT NULL,
    message TEXT NOT NULL,
    ok INTEGER NOT NULL,
    at REAL NOT NULL
);

-- Who has a board open. `viewer` is kept in the browser tab's sessionStorage, so a reload is
-- the same viewer and does not flicker in everyone else's avatars.
CREATE TABLE presence (
    board_id INTEGER NOT NULL REFERENCES board (id) ON DELETE CASCADE,
    viewer TEXT NOT NULL,
    name TEXT NOT NULL,
    seen_at REAL NOT NULL,
    PRIMARY KEY (board_id, viewer)
) WITHOUT ROWID;
