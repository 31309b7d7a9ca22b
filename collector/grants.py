"""Read-only PostgreSQL roles for dashboards: the SQL behind ``collector db grant-readonly``."""

from __future__ import annotations

import re

import psycopg
from psycopg import sql

API_SCHEMA = "collector_api"
# Lower case only: such a name needs no quoting in psql, pg_hba.conf or a Grafana form.
ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]*")
MAX_ROLE_NAME = 63  # NAMEDATALEN - 1; PostgreSQL would silently truncate a longer one
# Names the role grammar treats as keywords rather than as a role.
RESERVED_ROLE_NAMES = frozenset({"public", "none", "current_role", "current_user", "session_user", "all"})


class GrantError(Exception):
    """The database cannot get a read-only role as asked; the message says why."""


def role_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a dashboard role, or None when it can."""
    if not ROLE_NAME.fullmatch(name):
        return f"{name!r} is not a role name: use lower-case letters, digits and '_', not starting with a digit"
    if len(name) > MAX_ROLE_NAME:
        return f"role name is {len(name)} characters long; PostgreSQL allows {MAX_ROLE_NAME}"
    if name.startswith("pg_") or name in RESERVED_ROLE_NAMES:
        return f"{name!r} is reserved by PostgreSQL"
    return None


def grant_readonly(conn: psycopg.Connection, role: str, password: str | None) -> str:
    """Create or update LOGIN ``role`` so it can read the collector_api views and nothing else we grant.

    Runs in the caller's transaction; returns "created" or "updated".
    """
    cur = conn.cursor()
    owner = cur.execute(
        "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %s", (API_SCHEMA,)
    ).fetchone()
    if owner is None:
        raise GrantError(f"schema {API_SCHEMA} does not exist: run `collector db upgrade` first")
    existing = cur.execute(
        "SELECT rolsuper, rolname = current_user FROM pg_roles WHERE rolname = %s", (role,)
    ).fetchone()
    if existing and existing[0]:
        raise GrantError(f"role {role} is a superuser, which reads everything: choose a dedicated role")
    if existing and existing[1]:
        raise GrantError(f"role {role} is the role this command connects as: choose a dedicated role")
    if not existing and password is None:
        raise GrantError(f"role {role} does not exist: pass --password-env to create it")

    ident = sql.Identifier(role)
    # libpq hashes the password (SCRAM or MD5, as the server's password_encryption says),
    # so the cleartext never reaches the server's logs or pg_stat_activity.
    secret = (sql.SQL(" PASSWORD {}").format(sql.Literal(conn.pgconn.encrypt_password(
        password.encode(), role.encode()).decode())) if password is not None else sql.SQL(""))
    if existing:
        cur.execute(sql.SQL("ALTER ROLE {} WITH LOGIN{}").format(ident, secret))
    else:
        cur.execute(sql.SQL("CREATE ROLE {} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION{}")
                    .format(ident, secret))
    schema = sql.Identifier(API_SCHEMA)
    row = cur.execute("SELECT current_database()").fetchone()
    assert row is not None  # the query answers exactly one row
    database = row[0]
    for statement in (
        # A second line of defence: even a stray grant elsewhere cannot be used to write.
        sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(ident),
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), ident),
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, ident),
        sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(schema, ident),
        # Views that later revisions add are created by the schema's owner (the role that
        # migrates); its default privileges hand them to this role as they appear.
        sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {} GRANT SELECT ON TABLES TO {}")
        .format(sql.Identifier(owner[0]), schema, ident),
    ):
        cur.execute(statement)
    return "updated" if existing else "created"
