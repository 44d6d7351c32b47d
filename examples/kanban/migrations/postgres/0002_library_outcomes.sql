-- Each tab's outcome is the library's now (its table lith_tab).
DROP TABLE outcome;
