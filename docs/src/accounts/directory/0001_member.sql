-- Who may use which account: read by admits before an account's own file opens.
CREATE TABLE member (account TEXT NOT NULL, user TEXT NOT NULL, PRIMARY KEY (account, user)) WITHOUT ROWID;
