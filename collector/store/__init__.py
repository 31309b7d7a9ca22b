"""Store functions: all SQL lives here, split by entity; callers pass the connection (one transaction) first."""
