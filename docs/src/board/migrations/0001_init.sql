CREATE TABLE card (
    id INTEGER PRIMARY KEY,
    board_id INTEGER NOT NULL,
    title TEXT NOT NULL,
    lane TEXT NOT NULL DEFAULT 'todo'
);
