"""The credential model on its own: roles, cluster scope, the file's rules, and how a keyring follows the file."""

from __future__ import annotations

import json
import os

import pytest

from collector import credentials
from collector.credentials import Credential
from collector.credentials import CredentialsError
from collector.credentials import Keyring
from collector.credentials import OutOfScope


class Ticks:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tokens_path(tmp_path):
    return tmp_path / "tokens.json"


def keyring(path, env=None, ticks=None) -> Keyring:
    ring = Keyring(path, env or {}, monotonic=ticks or Ticks())
    ring.load()
    return ring


@pytest.mark.parametrize("role, method, allowed", [
    ("read", "GET", True), ("read", "HEAD", True), ("read", "POST", False), ("read", "DELETE", False),
    ("write", "GET", True), ("write", "PUT", True), ("write", "POST", True), ("write", "DELETE", False),
    ("admin", "DELETE", True), ("admin", "PATCH", True),
])
def test_roles_allow_methods(role, method, allowed):
    assert (Credential("c", role).refusal(method) is None) is allowed


def test_refusals_say_what_is_needed():
    assert Credential("w", "write").refusal("DELETE") == (
        "credential 'w' has the write role: DELETE needs an admin credential")
    assert Credential("r", "read").refusal("PUT") == "credential 'r' has the read role: it cannot PUT"
    assert Credential(credentials.ENV_READ, "read").refusal("PUT") == "the read token cannot write; use the write token"


def test_cluster_scope_settles_identity_and_refuses_other_clusters():
    one = Credential("b", "write", ("b200",))
    assert one.cluster_for(None) == "b200"
    assert one.cluster_for("b200") == "b200"
    with pytest.raises(OutOfScope, match="may write cluster b200, not h100") as refused:
        one.cluster_for("h100")
    assert refused.value.clusters == ["b200"]
    two = Credential("bh", "write", ("b200", "h100"))
    assert two.cluster_for("h100") == "h100"
    with pytest.raises(OutOfScope, match="writes clusters b200, h100: name one"):
        two.cluster_for(None)
    assert Credential("any", "write").cluster_for(None) is None
    assert Credential("any", "write").cluster_for("x") == "x"


def test_add_stores_the_digest_never_the_secret(tokens_path):
    secret = credentials.add(tokens_path, "b200", "write", ("b200",))
    text = tokens_path.read_text()
    assert secret.startswith("clt_") and len(secret) > 40
    assert secret not in text
    assert credentials.digest(secret) in text
    assert oct(os.stat(tokens_path).st_mode & 0o777) == "0o600"
    assert keyring(tokens_path).lookup(secret) == Credential("b200", "write", ("b200",))


@pytest.mark.parametrize("role, clusters, problem", [
    ("read", ("b200",), "only write credentials are limited to clusters"),
    ("admin", ("b200",), "only write credentials are limited to clusters"),
    ("write", ("b200", "b200"), "lists a cluster twice"),
])
def test_add_refuses_scopes_that_would_mislead(tokens_path, role, clusters, problem):
    with pytest.raises(CredentialsError, match=problem):
        credentials.add(tokens_path, "x", role, clusters)
    assert not tokens_path.exists()


def test_add_refuses_a_taken_name_and_a_bad_one(tokens_path):
    credentials.add(tokens_path, "ops", "admin")
    with pytest.raises(CredentialsError, match="a credential called 'ops' exists"):
        credentials.add(tokens_path, "ops", "read")
    with pytest.raises(CredentialsError, match="name: String should match pattern"):
        credentials.add(tokens_path, "env:write", "read")
    assert [t.name for t in credentials.read_file(tokens_path)[0].tokens] == ["ops"]


@pytest.mark.parametrize("mode, who", [(0o664, "its group"), (0o646, "others")])
def test_a_file_others_can_write_is_refused(tokens_path, mode, who):
    credentials.add(tokens_path, "ops", "admin")
    tokens_path.chmod(mode)
    with pytest.raises(CredentialsError, match=f"is writable by {who} .*chmod go-w"):
        keyring(tokens_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_of_another_user_is_refused(tokens_path):
    credentials.add(tokens_path, "ops", "admin")
    os.chown(tokens_path, 65534, 65534)
    with pytest.raises(CredentialsError, match="belongs to uid 65534"):
        keyring(tokens_path)


@pytest.mark.parametrize("body, problem", [
    ("{", "is not valid: the file: Invalid JSON"),
    ('{"version": 1, "tokens": [], "extra": 1}', "extra: Extra inputs are not permitted"),
    ('{"version": 2}', "version: Input should be 1"),
])
def test_an_invalid_file_is_refused_saying_where(tokens_path, body, problem):
    tokens_path.write_text(body)
    tokens_path.chmod(0o600)
    with pytest.raises(CredentialsError, match=problem):
        keyring(tokens_path)


def test_two_credentials_with_one_name_are_refused(tokens_path):
    credentials.add(tokens_path, "a", "read")
    data = json.loads(tokens_path.read_text())
    data["tokens"].append({**data["tokens"][0], "sha256": "0" * 64})
    tokens_path.write_text(json.dumps(data))
    with pytest.raises(CredentialsError, match="two credentials share the name 'a'"):
        keyring(tokens_path)


def test_a_file_secret_equal_to_an_environment_token_is_refused(tokens_path):
    secret = credentials.add(tokens_path, "a", "read")
    with pytest.raises(CredentialsError, match="a has the secret of an environment token"):
        keyring(tokens_path, credentials.env_credentials(secret, None))


def test_environment_tokens_keep_their_powers():
    ring = Keyring(None, credentials.env_credentials("w", "r"))
    assert ring.enabled
    assert ring.lookup("w") == Credential(credentials.ENV_WRITE, "admin")
    assert ring.lookup("r") == Credential(credentials.ENV_READ, "read")
    assert ring.lookup("x") is None
    assert ring.lookup(None) is None
    assert not Keyring(None, {}).enabled


def test_a_new_token_works_at_its_first_use(tokens_path):
    credentials.add(tokens_path, "old", "read")
    ticks = Ticks()
    ring = keyring(tokens_path, ticks=ticks)
    new = credentials.add(tokens_path, "new", "read")
    # No time has passed, but an unknown token makes the keyring look at the file.
    assert ring.lookup(new) == Credential("new", "read")


def test_a_removed_token_is_refused_after_the_next_check(tokens_path):
    old = credentials.add(tokens_path, "old", "read")
    ticks = Ticks()
    ring = keyring(tokens_path, ticks=ticks)
    credentials.remove(tokens_path, "old")
    assert ring.lookup(old) == Credential("old", "read"), "looked at most once per check_every_s"
    ticks.now += credentials.CHECK_EVERY_S
    assert ring.lookup(old) is None


def test_a_broken_edit_keeps_the_last_good_credentials_and_says_so_once(tokens_path, caplog):
    secret = credentials.add(tokens_path, "keep", "read")
    ticks = Ticks()
    ring = keyring(tokens_path, ticks=ticks)
    outcomes: list[bool] = []
    ring.on_reload = outcomes.append
    tokens_path.write_text("{ not json")
    for _ in range(3):
        ticks.now += credentials.CHECK_EVERY_S
        assert ring.lookup(secret) == Credential("keep", "read")
    assert outcomes == [False]
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f"tokens file {tokens_path} is not valid: the file: Invalid JSON: key must be a string at line 1 column 3; "
        "still using the credentials read before"]
    # The fix: the file written anew, with another credential.
    tokens_path.unlink()
    again = credentials.add(tokens_path, "again", "admin")
    ticks.now += credentials.CHECK_EVERY_S
    assert ring.lookup(again) == Credential("again", "admin")
    assert ring.lookup(secret) is None
    assert outcomes == [False, True]


def test_uses_are_taken_once(tokens_path):
    secret = credentials.add(tokens_path, "a", "read")
    ring = keyring(tokens_path)
    ring.lookup(secret)
    ring.lookup("unknown")
    assert list(ring.take_uses()) == ["a"]
    assert ring.take_uses() == {}


def test_an_edit_that_would_break_the_file_writes_nothing(tokens_path):
    credentials.add(tokens_path, "a", "read")
    before = tokens_path.read_bytes()
    expected = f"the edit would leave {tokens_path} invalid: the file: two credentials share the name 'a'"
    with pytest.raises(CredentialsError) as refused, credentials.editing(tokens_path) as tokens:
        tokens.tokens.append(tokens.tokens[0])
    assert str(refused.value) == expected
    assert tokens_path.read_bytes() == before
