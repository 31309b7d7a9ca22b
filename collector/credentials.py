"""Who may do what: the spec's environment tokens beside the named credentials of the tokens file.

The tokens file (``COLLECTOR_TOKENS_FILE``) is JSON holding SHA-256 digests, never secrets::

    {"version": 1, "tokens": [{"name": "b200-reporter", "role": "write", "clusters": ["b200"],
                               "sha256": "<64 hex>", "created_at": "2026-12-04T13:51:19Z"}]}

Secrets are 256 random bits, so one SHA-256 is as good as a slow hash: nobody can guess
one from its digest. A request's token is hashed and looked up by digest, so the work
does not depend on which credential, if any, it matches.

Every process re-reads the file when it changes (``Keyring``): a token added is known at
its first use, one removed is refused within a second (docs/operations.md, "Tokens").
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import hashlib
import logging
import os
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated
from typing import Literal

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import ValidationError
from pydantic import model_validator

from collector.contract import MAX_ID_LENGTH
from collector.settings import Settings
from collector.settings import SettingsError

log = logging.getLogger("collector.credentials")

ROLES = ("read", "write", "admin")
Role = Literal["read", "write", "admin"]
# The names the spec's tokens write under; a file name cannot hold a colon, so none collides.
ENV_WRITE = "env:write"
ENV_READ = "env:read"
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# How often a process looks at the file for changes (a stat), at most: a removed token is
# refused within this long. An unknown token looks at once, so a new one works at first use.
CHECK_EVERY_S = 1.0
# A tokens file is small; a bigger one is a mistake (or an attack), not a list of credentials.
MAX_FILE_BYTES = 1024 * 1024
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class CredentialsError(SettingsError):
    """A tokens file the collector refuses to use; the message says why and what to do."""


def digest(secret: str) -> str:
    """The hex SHA-256 a secret is stored and looked up as."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    """A fresh secret: 256 random bits, URL-safe, with a prefix secret scanners can match."""
    return "clt_" + secrets.token_urlsafe(32)


@dataclasses.dataclass(frozen=True)
class Credential:
    """A name and what it may do; ``clusters`` limits a write credential (empty: every cluster)."""

    name: str
    role: Role
    clusters: tuple[str, ...] = ()

    def refusal(self, method: str) -> str | None:
        """Why this credential may not make a ``method`` request at all, or None when its role allows it."""
        if method in READ_METHODS:
            return None
        if self.name == ENV_READ:
            return "the read token cannot write; use the write token"
        if self.role == "read":
            return f"credential {self.name!r} has the read role: it cannot {method}"
        if method == "DELETE" and self.role != "admin":
            return f"credential {self.name!r} has the {self.role} role: DELETE needs an admin credential"
        return None

    def cluster_for(self, named: str | None) -> str | None:
        """The cluster a write naming ``named`` lands on; raises ``OutOfScope`` for one it may not write.

        A write that names no cluster, made with a credential of exactly one cluster, is that
        cluster's: the scope settles identity.
        """
        if not self.clusters:
            return named
        if named is None:
            if len(self.clusters) == 1:
                return self.clusters[0]
            raise OutOfScope(self, None)
        if named not in self.clusters:
            raise OutOfScope(self, named)
        return named


class OutOfScope(Exception):
    """A write to a cluster its credential may not write (a 403 naming the ones it may)."""

    def __init__(self, credential: Credential, cluster: str | None) -> None:
        self.clusters = list(credential.clusters)
        allowed = ", ".join(credential.clusters)
        if cluster is None:
            message = (f"credential {credential.name!r} writes clusters {allowed}: "
                       "name one (the body's cluster, metadata.cluster or ?cluster=)")
        else:
            message = f"credential {credential.name!r} may write cluster {allowed}, not {cluster}"
            if len(credential.clusters) > 1:
                message = f"credential {credential.name!r} may write clusters {allowed}, not {cluster}"
        super().__init__(message)


class TokenEntry(BaseModel):
    """One credential as the tokens file holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    role: Role
    clusters: tuple[Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)], ...] = ()
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    created_at: dt.datetime

    @model_validator(mode="after")
    def _only_writes_are_scoped(self) -> TokenEntry:
        if self.clusters and self.role != "write":
            # A read or admin credential limited to a cluster would look safer than it is.
            raise ValueError(f"only write credentials are limited to clusters; {self.name!r} is {self.role}")
        if len(set(self.clusters)) != len(self.clusters):
            raise ValueError(f"{self.name!r} lists a cluster twice")
        return self

    def credential(self) -> Credential:
        """What the entry allows."""
        return Credential(self.name, self.role, self.clusters)


class TokensFile(BaseModel):
    """The whole tokens file."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    tokens: list[TokenEntry] = []

    @model_validator(mode="after")
    def _unique(self) -> TokensFile:
        for field in ("name", "sha256"):
            seen: set[str] = set()
            for entry in self.tokens:
                value = getattr(entry, field)
                if value in seen:
                    what = f"name {value!r}" if field == "name" else f"secret (digest {value[:12]}...)"
                    raise ValueError(f"two credentials share the {what}")
                seen.add(value)
        return self

    def find(self, name: str) -> TokenEntry | None:
        """The entry called ``name``, if any."""
        return next((entry for entry in self.tokens if entry.name == name), None)


def check_permissions(path: Path, st: os.stat_result) -> None:
    """Refuse a file that anyone but its owner (this user or root) can write: they could make themselves admin."""
    if not stat.S_ISREG(st.st_mode):
        raise CredentialsError(f"tokens file {path} is not a regular file")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CredentialsError(
            f"tokens file {path} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} "
            f"(mode {stat.S_IMODE(st.st_mode):04o}), so they could grant themselves any role: "
            f"run `chmod go-w {path}`"
        )
    if st.st_uid not in (os.geteuid(), 0):
        raise CredentialsError(
            f"tokens file {path} belongs to uid {st.st_uid}, neither this user (uid {os.geteuid()}) nor root, "
            f"so its owner could grant themselves any role: `chown` it to the user that runs the collector"
        )


def _problem(exc: ValidationError, where_none: str) -> str:
    """The first problem pydantic found, as "where: what" (without pydantic's "Value error, " prefix)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or where_none
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _parse(path: Path, raw: bytes) -> TokensFile:
    try:
        return TokensFile.model_validate_json(raw)
    except ValidationError as exc:
        raise CredentialsError(f"tokens file {path} is not valid: {_problem(exc, 'the file')}") from None


def read_file(path: Path) -> tuple[TokensFile, os.stat_result]:
    """Read and check the tokens file; raises ``CredentialsError`` saying what is wrong."""
    try:
        with path.open("rb") as handle:
            st = os.fstat(handle.fileno())
            check_permissions(path, st)
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise CredentialsError(f"tokens file {path} does not exist: create it with `collector token add`") from None
    except PermissionError:
        raise CredentialsError(f"tokens file {path} cannot be read by this user (uid {os.geteuid()})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise CredentialsError(f"tokens file {path} is larger than {MAX_FILE_BYTES} bytes")
    return _parse(path, raw), st


def _signature(st: os.stat_result) -> tuple[int, int, int, int, int]:
    # An atomic rename changes the inode; an edit in place, the size or times.
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def env_credentials(write_token: str | None, read_token: str | None) -> dict[str, Credential]:
    """The spec's tokens by digest: the write token may do everything it always could, DELETE included."""
    found: dict[str, Credential] = {}
    if read_token:
        found[digest(read_token)] = Credential(ENV_READ, "read")
    if write_token:
        # Set last: the spec's write token wins if both variables hold one secret.
        found[digest(write_token)] = Credential(ENV_WRITE, "admin")
    return found


def keyring_for(settings: Settings) -> Keyring:
    """The credentials ``settings`` configure: the tokens file's (not read yet) and the spec's tokens."""
    return Keyring(settings.tokens_file, env_credentials(settings.write_token, settings.read_token))


def check_file(settings: Settings) -> int:
    """Refuse to start on a tokens file no process could use; how many credentials it holds.

    Run once when a server starts (``collector serve``, the gunicorn master): a worker that
    meets a broken file later keeps serving (``Keyring.refresh``) instead of dying over it.
    """
    if settings.tokens_file is None:
        return 0
    keyring = keyring_for(settings)
    keyring.load()
    return keyring.file_credentials


class Keyring:
    """The credentials one process knows, re-read from the tokens file when it changes."""

    def __init__(self, path: Path | None, env: dict[str, Credential], *,
                 check_every_s: float = CHECK_EVERY_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.env = env
        self.check_every_s = check_every_s
        self.monotonic = monotonic
        # Replaced whole on reload, never mutated: readers on other threads need no lock.
        self._by_digest: dict[str, Credential] = dict(env)
        self.file_credentials = 0
        self._signature: tuple[int, ...] | None = None
        self._checked_at = -float("inf")
        self._reload_lock = threading.Lock()
        self._failed: tuple[object, ...] | None = None
        # Credential name -> the wall-clock second it was last used in this process (see take_uses).
        self._uses: dict[str, float] = {}
        self.on_reload: Callable[[bool], None] = lambda ok: None

    @property
    def enabled(self) -> bool:
        """Whether requests need a token at all."""
        return self.path is not None or bool(self.env)

    def load(self) -> None:
        """Read the file now; raises ``CredentialsError`` (a server refuses to start on it).

        Otherwise the file is first read at the first request: building the app (for a
        migration, say) must not need it.
        """
        assert self.path is not None
        tokens, st = read_file(self.path)
        by_digest = {entry.sha256: entry.credential() for entry in tokens.tokens}
        clash = by_digest.keys() & self.env.keys()
        if clash:
            names = ", ".join(sorted(by_digest[d].name for d in clash))
            raise CredentialsError(f"tokens file {self.path}: {names} has the secret of an environment token")
        self._by_digest = {**by_digest, **self.env}
        self.file_credentials = len(by_digest)
        self._signature = _signature(st)
        self._checked_at = self.monotonic()

    def refresh(self, *, force: bool = False) -> None:
        """Re-read the file if it changed (looked at once per ``check_every_s`` unless ``force``)."""
        if self.path is None or (not force and self.monotonic() - self._checked_at < self.check_every_s):
            return
        # Another thread may be reading it. A periodic look then uses what is known; an unknown
        # token waits for that read, which may be the one that knows it (two first uses at once).
        if not self._reload_lock.acquire(blocking=force):
            return
        try:
            self._checked_at = self.monotonic()
            try:
                signature = _signature(os.stat(self.path))
            except OSError as exc:
                signature = None
                self._keep_last(f"tokens file {self.path} cannot be read ({exc.strerror})", ("missing",))
            if signature is None or signature == self._signature:
                return
            try:
                self.load()
            except CredentialsError as exc:
                self._keep_last(str(exc), signature)
                return
            self._failed = None
            log.info("tokens file %s reloaded: %d credentials", self.path, self.file_credentials)
            self.on_reload(True)
        finally:
            self._reload_lock.release()

    def _keep_last(self, why: str, signature: tuple[object, ...]) -> None:
        # A broken edit must not lock everyone out: serve the last good file, and say so once per change.
        if self._failed != signature:
            self._failed = signature
            known = ("still using the credentials read before" if self._signature is not None
                     else "until it is fixed this process knows only the spec's tokens")
            log.error("%s; %s", why, known)
            self.on_reload(False)

    def lookup(self, token: str | None) -> Credential | None:
        """The credential ``token`` is the secret of, or None."""
        self.refresh()
        if token is None:
            return None
        key = digest(token)
        found = self._by_digest.get(key)
        if found is None and self.path is not None:
            # Perhaps it was added a moment ago: one stat tells, so a new token works at first use.
            self.refresh(force=True)
            found = self._by_digest.get(key)
        if found is not None:
            self._uses[found.name] = time.time()
        return found

    def take_uses(self) -> dict[str, float]:
        """The credentials used since the last call, with when; the janitor writes them down."""
        uses, self._uses = self._uses, {}
        return uses


# --- writing the file (`collector token`) ---------------------------------------------------


@contextlib.contextmanager
def editing(path: Path) -> Iterator[TokensFile]:
    """Read the file (empty when new), let the caller change it, write it back atomically.

    A lock file beside it serialises concurrent edits; the new file replaces the old by
    rename, so a reader sees the old or the new, never half of one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        owner: tuple[int, int] | None = None
        if path.exists():
            tokens, st = read_file(path)
            mode, owner = stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid)
        else:
            tokens, mode = TokensFile(), 0o600
        yield tokens
        try:
            TokensFile.model_validate(tokens.model_dump())  # the edit keeps the file valid
        except ValidationError as exc:
            raise CredentialsError(f"the edit would leave {path} invalid: {_problem(exc, 'the file')}") from None
        body = tokens.model_dump_json(indent=2) + "\n"
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as handle:
                os.fchmod(handle.fileno(), mode)
                if owner is not None and owner != (os.geteuid(), os.getegid()):
                    # Keep a root:collector 0640 file readable by the service after root edits it.
                    os.fchown(handle.fileno(), *owner)
                handle.write(body)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def add(path: Path, name: str, role: Role, clusters: tuple[str, ...] = (),
        now: dt.datetime | None = None) -> str:
    """Add credential ``name`` to the file; returns its secret, which is stored nowhere."""
    secret = new_secret()
    with editing(path) as tokens:
        if tokens.find(name) is not None:
            raise CredentialsError(f"a credential called {name!r} exists in {path}: remove it first, or pick a name")
        try:
            entry = TokenEntry(name=name, role=role, clusters=clusters, sha256=digest(secret),
                               created_at=(now or dt.datetime.now(dt.UTC)).replace(microsecond=0))
        except ValidationError as exc:
            raise CredentialsError(_problem(exc, "")) from None
        tokens.tokens.append(entry)
    return secret


def remove(path: Path, name: str) -> None:
    """Remove credential ``name``; its secret stops working within a second everywhere the file is read."""
    with editing(path) as tokens:
        entry = tokens.find(name)
        if entry is None:
            raise CredentialsError(f"no credential called {name!r} in {path}")
        tokens.tokens.remove(entry)

