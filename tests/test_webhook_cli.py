"""``collector webhook add|list|remove`` against the database, as the API sees the same rows."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from collector.cli import main

HOOK = "https://hooks.example/cli"


def run(database, *args: str, **env: str):
    return CliRunner().invoke(main, [*args, "--db", database.url], env=env)


def test_add_list_and_remove_are_what_the_api_shows(database, api):
    added = run(database, "webhook", "add", HOOK, "--status", "failed", "--status", "timeout", "--cluster", "b200",
                "--secret-env", "HOOK_SECRET", "--format", "slack", HOOK_SECRET="from-env")
    assert added.exit_code == 0, added.output
    created = json.loads(added.output)
    assert "from-env" not in added.output
    assert created.pop("created_at").endswith("Z")
    assert created == {"id": 1, "url": HOOK, "statuses": ["failed", "timeout"], "clusters": ["b200"],
                       "format": "slack", "signed": True, "enabled": True, "disabled_reason": None,
                       "created_by": None}
    assert database.scalar("SELECT secret FROM webhooks") == "from-env"
    assert api.post("/api/webhooks", json={"url": "http://127.0.0.1:9/other"}).status_code == 201

    listed = run(database, "webhook", "list")
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines() == [
        "ID  URL                        STATUSES                  CLUSTERS  FORMAT  SIGNED  ENABLED",
        "1   https://hooks.example/cli  failed,timeout            b200      slack   yes     yes",
        "2   http://127.0.0.1:9/other   completed,failed,timeout  *         json    no      yes",
    ]
    as_json = run(database, "webhook", "list", "--json")
    assert json.loads(as_json.output) == api.get("/api/webhooks").json()["webhooks"]

    removed = run(database, "webhook", "remove", "1")
    assert (removed.exit_code, removed.output) == (0, f"webhook 1 removed ({HOOK})\n")
    assert [hook["id"] for hook in api.get("/api/webhooks").json()["webhooks"]] == [2]
    again = run(database, "webhook", "remove", "1")
    assert (again.exit_code, again.output) == (1, "Error: no webhook 1\n")


@pytest.mark.parametrize(("args", "env", "problem"), [
    (["add", "ftp://files.example/x"], {}, "Error: invalid webhook: url: Value error, must be an http:// or https:// "
                                           "URL, not ftp\n"),
    (["add", HOOK, "--status", "exploded"], {}, "Error: invalid webhook: statuses.0: Input should be 'submitted', "),
    (["add", HOOK, "--cluster", "a/b"], {}, "Error: invalid webhook: clusters.0: String should match pattern"),
    (["add", HOOK, "--secret-env", "UNSET_HOOK_SECRET"], {},
     "Error: UNSET_HOOK_SECRET is not set or empty: export the webhook's secret in it\n"),
    (["add", HOOK, "--format", "teams"], {}, "Usage: "),
    (["remove", "0"], {}, "Usage: "),
    (["remove", "abc"], {}, "Usage: "),
])
def test_refusals_say_what_is_wrong_and_store_nothing(database, args, env, problem):
    database.clean()
    result = run(database, "webhook", *args, **env)
    assert result.exit_code != 0
    assert result.output.startswith(problem), result.output
    assert database.scalar("SELECT count(*) FROM webhooks") == 0


def test_an_unmigrated_database_is_named_with_the_fix(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    result = CliRunner().invoke(main, ["webhook", "list", "--db", url])
    assert (result.exit_code, result.output) == (
        1, f"Error: database {url} has no webhooks table: run `collector db upgrade` first\n")
