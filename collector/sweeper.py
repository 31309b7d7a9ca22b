"""Who sweeps: one process of the whole deployment at a time holds the stale-job sweeper role.

The role is a lock that dies with its holder, so a process that is killed gives it up
without running any code, and whichever process tries next takes it:

- PostgreSQL: a session-level advisory lock on a connection of its own (not one of the
  pool's, which requests check out and the pool may close), held for as long as the
  process leads; the server releases it when that connection ends.
- SQLite: the processes sharing the file are on one host, so an ``flock`` on a file next
  to the database; the kernel releases it when the process dies.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import Protocol

import psycopg

from collector.db import Database

log = logging.getLogger("collector.stale")

# Advisory-lock namespace (first key of the (int, int) form), next to the ones in
# collector/store/identity.py: JOB_LOCK 1, FEED_LOCK 2. The second key is always 0.
SWEEPER_LOCK = 3
# Shown in pg_stat_activity, so an operator can see (and test) which backend holds the role.
APPLICATION_NAME = "collector-sweeper"
_TRY_LOCK = "SELECT pg_try_advisory_lock(%s, 0)"
# Still ours: the connection answers and the lock is granted to its backend.
_STILL_HELD = ("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
               "AND classid = %s AND objid = 0 AND objsubid = 2 AND granted)")


def _single(conn: psycopg.Connection[tuple[object, ...]], sql: str) -> bool:
    """The one boolean ``sql`` (about the sweeper's lock) answers."""
    row = conn.execute(sql, (SWEEPER_LOCK,)).fetchone()
    return row is not None and bool(row[0])


class Leadership(Protocol):
    """A lock held for as long as this process is the sweeper."""

    def hold(self) -> bool:
        """Keep the lock if it is still ours, else try once to take it; whether this process holds it now."""

    def release(self) -> None:
        """Give the lock up (nothing if not held)."""


class AdvisoryLock:
    """The sweeper role on PostgreSQL: ``pg_try_advisory_lock`` on a dedicated connection."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._conn: psycopg.Connection | None = None
        self._unreachable = False

    def hold(self) -> bool:
        """Keep the lock if its connection still holds it (False if lost), else try once on a fresh connection."""
        if self._conn is not None:
            if self._still_held():
                return True
            # Lost (the connection died): say so; the caller may try again at once.
            self.release()
            return False
        try:
            conn = self._connect()
        except psycopg.Error as exc:
            self._warn_unreachable(exc)
            return False
        self._unreachable = False
        try:
            taken = _single(conn, _TRY_LOCK)
        except psycopg.Error as exc:
            conn.close()
            self._warn_unreachable(exc)
            return False
        if not taken:
            # Another process leads: no idle connection per waiting process, a fresh one each try.
            conn.close()
            return False
        self._conn = conn
        return True

    def release(self) -> None:
        """Close the lock's connection; the server releases the lock with it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _still_held(self) -> bool:
        if self._conn is None:
            return False
        try:
            return _single(self._conn, _STILL_HELD)
        except psycopg.Error as exc:
            log.warning("the stale-job sweeper's lock connection failed: %s", str(exc).strip().splitlines()[0])
            return False

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        engine = self.database.engine
        args, kwargs = engine.dialect.create_connect_args(engine.url)
        # Keepalives: a lock holder behind a dead network path must notice, not wait forever.
        # Defaults only: the same parameters in the database URL win.
        params = {"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                  "keepalives_count": 3, **kwargs, "application_name": APPLICATION_NAME, "autocommit": True}
        return psycopg.connect(*args, **params)

    def _warn_unreachable(self, exc: psycopg.Error) -> None:
        # Once per outage: every process retries every interval until the database is back.
        if not self._unreachable:
            log.warning("cannot take the stale-job sweeper lock: %s", str(exc).strip().splitlines()[0])
        self._unreachable = True


class FileLock:
    """The sweeper role on SQLite: a non-blocking ``flock`` on a file next to the database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def hold(self) -> bool:
        """Keep the lock if held, else try once to take it."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # flock, not fcntl's record locks: those belong to the process, so a second
            # opener in the same process would "get" them too, and any close drops them.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        # For people: which process leads (the lock, not this text, is what counts).
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        """Close the file; the kernel releases the lock with it."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class Alone:
    """The sweeper role of an in-memory SQLite database: no other process can see it, so always held."""

    def hold(self) -> bool:
        """Always held."""
        return True

    def release(self) -> None:
        """Nothing to give up."""


def lock_path(database: Database) -> Path | None:
    """The sweeper lock file of a SQLite database (``<db>.sweeper.lock``); None for an in-memory one."""
    name = database.engine.url.database
    if not name or name == ":memory:" or name.startswith("file::memory:"):
        return None
    return Path(name).expanduser().with_name(Path(name).name + ".sweeper.lock")


def leadership(database: Database) -> Leadership:
    """The sweeper lock that fits ``database``'s backend."""
    if not database.is_sqlite:
        return AdvisoryLock(database)
    path = lock_path(database)
    return Alone() if path is None else FileLock(path)
