"""The operator's books: one usage record per finished request and one audit entry per admin
action, appended to a database (SQLite, WAL) off the event loop (docs/ledger.md)."""
