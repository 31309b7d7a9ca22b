"""Settings: environment parsing, URL normalisation and the startup refusals the spec requires."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from collector.app import create_app
from collector.app import prepare_to_serve
from collector.settings import Settings
from collector.settings import SettingsError
from collector.settings import database_url
from collector.settings import is_loopback


def test_defaults_are_sqlite_on_loopback_8080():
    settings = Settings.from_env({})
    assert settings.host == "127.0.0.1" and settings.port == 8080
    assert settings.database_url == "sqlite:///" + str(Path("~/.local/state/collector/status.db").expanduser())
    assert settings.write_token is None and settings.read_token is None
    assert settings.migrates_on_start


def test_tokens_come_from_the_named_variables():
    env = {"COLLECTOR_TOKEN_ENV": "MY_W", "COLLECTOR_READ_TOKEN_ENV": "MY_R", "MY_W": "w", "MY_R": "r",
           "SRTCTL_STATUS_TOKEN": "ignored"}
    settings = Settings.from_env(env)
    assert (settings.write_token, settings.read_token) == ("w", "r")
    flag = Settings.from_env({"ALT": "x"}, token_env="ALT")
    assert flag.write_token == "x" and flag.token_env == "ALT"


def test_environment_variables_and_overrides():
    env = {"COLLECTOR_DATABASE_URL": "postgresql://u@h/db", "COLLECTOR_HOST": "0.0.0.0", "COLLECTOR_PORT": "9000",
           "COLLECTOR_ALLOW_UNAUTHENTICATED": "true", "COLLECTOR_CORS_ORIGINS": "https://a, https://b"}
    settings = Settings.from_env(env)
    assert settings.database_url == "postgresql+psycopg://u@h/db"
    assert (settings.host, settings.port, settings.allow_unauthenticated) == ("0.0.0.0", 9000, True)
    assert settings.cors_origins == ("https://a", "https://b")
    assert not settings.migrates_on_start
    assert Settings.from_env(env, port=1234, database_url="/tmp/x.db").database_url == "sqlite:////tmp/x.db"


def test_bad_integer_variable_is_a_clear_error():
    with pytest.raises(SettingsError, match="COLLECTOR_PORT must be an integer, got 'eighty'"):
        Settings.from_env({"COLLECTOR_PORT": "eighty"})


@pytest.mark.parametrize(
    "value, expected",
    [("relative.db", "sqlite:///" + str(Path("relative.db").resolve())),
     ("postgres://h/db", "postgresql+psycopg://h/db"),
     ("sqlite:////abs/x.db", "sqlite:////abs/x.db")],
)
def test_database_url_forms(value, expected):
    assert database_url(value) == expected


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                            ("127.1.2.3", True), ("0.0.0.0", False), ("10.0.0.1", False),
                                            ("login-node", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def serve_check(tmp_path, **settings):
    prepare_to_serve(create_app(Settings(database_url=f"sqlite:///{tmp_path / 's.db'}", **settings)))


def test_read_token_without_write_token_refuses_to_start(tmp_path):
    with pytest.raises(SettingsError, match="read token .* without a write token"):
        serve_check(tmp_path, read_token="r")


def test_no_token_off_loopback_refuses_to_start(tmp_path):
    with pytest.raises(SettingsError, match="refusing to listen on 0.0.0.0 without a token"):
        serve_check(tmp_path, host="0.0.0.0")


def test_no_token_off_loopback_is_allowed_when_asked(tmp_path):
    serve_check(tmp_path, host="0.0.0.0", allow_unauthenticated=True)
    serve_check(tmp_path, host="0.0.0.0", write_token="w")


STREAM_VARIABLES = {"COLLECTOR_STREAM_HEARTBEAT": "2.5", "COLLECTOR_STREAM_MAX_LIFETIME": "60",
                    "COLLECTOR_STREAM_POLL_INTERVAL": "0.05", "COLLECTOR_MAX_STREAMS": "7", "COLLECTOR_THREADS": "3"}
DEFAULTS = (30.0, 900.0, 0.5, 500, 2)  # two request threads: the default database is SQLite


def stream_settings(settings):
    return (settings.stream_heartbeat_s, settings.stream_max_lifetime_s, settings.stream_poll_s, settings.max_streams,
            settings.request_threads)


def test_stream_variables_and_their_defaults():
    assert stream_settings(Settings.from_env(STREAM_VARIABLES)) == (2.5, 60.0, 0.05, 7, 3)
    assert stream_settings(Settings.from_env({})) == DEFAULTS
    # An empty variable (a blank line in an EnvironmentFile) means the default, as for the others.
    assert stream_settings(Settings.from_env(dict.fromkeys(STREAM_VARIABLES, ""))) == DEFAULTS


@pytest.mark.parametrize(
    "url, threads, expected",
    [("sqlite:///c.db", None, 2), ("postgresql:///c", None, 8), ("sqlite:///c.db", 6, 6), ("postgresql:///c", 3, 3)],
)
def test_request_threads_default_to_the_database_and_yield_to_the_variable(url, threads, expected):
    env = {"COLLECTOR_DATABASE_URL": url, **({"COLLECTOR_THREADS": str(threads)} if threads else {})}
    settings = Settings.from_env(env)
    assert (settings.threads, settings.request_threads) == (threads, expected)


@pytest.mark.parametrize(
    "name, value, kind",
    [("COLLECTOR_STREAM_HEARTBEAT", "30s", "a number"), ("COLLECTOR_STREAM_MAX_LIFETIME", "15m", "a number"),
     ("COLLECTOR_STREAM_POLL_INTERVAL", "fast", "a number"), ("COLLECTOR_MAX_STREAMS", "2.5", "an integer")],
)
def test_bad_stream_variable_is_an_error_naming_it(name, value, kind):
    with pytest.raises(SettingsError, match=f"^{name} must be {kind}, got '{value}'$"):
        Settings.from_env({**STREAM_VARIABLES, name: value})


STREAM_FIELDS = ("stream_heartbeat_s", "stream_max_lifetime_s", "stream_poll_s", "max_streams", "threads")


@pytest.mark.parametrize(
    "name, value, message",
    [("COLLECTOR_STREAM_HEARTBEAT", "0", "stream_heartbeat_s must be a positive number of seconds"),
     ("COLLECTOR_STREAM_MAX_LIFETIME", "-5", "stream_max_lifetime_s must be a positive number of seconds"),
     ("COLLECTOR_STREAM_POLL_INTERVAL", "0", "stream_poll_s must be a positive number of seconds"),
     ("COLLECTOR_STREAM_POLL_INTERVAL", "nan", "stream_poll_s must be a positive number of seconds"),
     ("COLLECTOR_MAX_STREAMS", "-1", "max_streams must be zero (streams off) or more"),
     ("COLLECTOR_THREADS", "0", "threads (COLLECTOR_THREADS) must be at least 1")],
)
def test_out_of_range_stream_variable_refuses_to_start(tmp_path, name, value, message):
    settings = Settings.from_env({**STREAM_VARIABLES, name: value})  # a number, so parsing takes it
    with pytest.raises(SettingsError, match=f"^{re.escape(message)}$"):
        settings.check()
    with pytest.raises(SettingsError, match=f"^{re.escape(message)}$"):
        serve_check(tmp_path, **{field: getattr(settings, field) for field in STREAM_FIELDS})


def test_zero_max_streams_is_allowed(tmp_path):
    serve_check(tmp_path, max_streams=0)  # streams off: every stream request answers 503


def test_serving_variables_are_read_once_for_serve_and_gunicorn():
    env = {"COLLECTOR_QUEUE_TIMEOUT": "2.5", "COLLECTOR_WORKERS": "3", "COLLECTOR_KEEPALIVE": "7",
           "COLLECTOR_WORKER_TIMEOUT": "90", "COLLECTOR_GRACEFUL_TIMEOUT": "10", "COLLECTOR_MAX_REQUESTS": "100",
           "COLLECTOR_LOG_LEVEL": "WARNING", "COLLECTOR_ACCESS_LOG_LEVEL": "error", "GUNICORN_LOG_LEVEL": "debug"}
    settings = Settings.from_env(env)
    assert (settings.queue_timeout_s, settings.worker_count, settings.keepalive_s, settings.worker_timeout_s,
            settings.graceful_timeout_s, settings.max_requests) == (2.5, 3, 7, 90, 10, 100)
    assert (settings.log_level, settings.access_log_level, settings.server_log_level) == ("warning", "error", "debug")


def test_the_pool_keeps_a_connection_per_request_thread_unless_told():
    assert Settings.from_env({}).pool_kept == 2 + 2
    assert Settings.from_env({"COLLECTOR_DATABASE_URL": "postgresql:///c"}).pool_kept == 8 + 2
    assert Settings.from_env({"COLLECTOR_THREADS": "3"}).pool_kept == 3 + 2
    assert Settings.from_env({"COLLECTOR_THREADS": "3", "COLLECTOR_POOL_SIZE": "4"}).pool_kept == 4


def test_workers_default_to_one_on_sqlite_and_two_per_cpu_on_postgresql():
    assert Settings.from_env({}).worker_count == 1
    cpus = os.cpu_count() or 1
    assert Settings.from_env({"COLLECTOR_DATABASE_URL": "postgresql://u@h/db"}).worker_count == 2 * cpus


@pytest.mark.parametrize("env, message", [
    ({"COLLECTOR_QUEUE_TIMEOUT": "0"}, "COLLECTOR_QUEUE_TIMEOUT"),
    ({"COLLECTOR_QUEUE_TIMEOUT": "soon"}, "COLLECTOR_QUEUE_TIMEOUT must be a number"),
    ({"COLLECTOR_WORKERS": "-1"}, "COLLECTOR_WORKERS"),
    ({"COLLECTOR_POOL_SIZE": "-1"}, r"^pool_size \(COLLECTOR_POOL_SIZE\) must be at least 1$"),
    ({"COLLECTOR_POOL_MAX_OVERFLOW": "-1"},
     r"^pool_max_overflow \(COLLECTOR_POOL_MAX_OVERFLOW\) must be zero or more$"),
    ({"COLLECTOR_LOG_LEVEL": "loud"}, "COLLECTOR_LOG_LEVEL must be one of debug, info, warning, error, critical"),
])
def test_serving_variables_are_checked(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env).check()


def test_webhook_settings_are_read_and_checked():
    read = Settings.from_env({"COLLECTOR_PUBLIC_URL": " https://gpu.example/status/ ",
                              "COLLECTOR_WEBHOOK_POLL_INTERVAL": "0.25"})
    assert (read.public_url, read.webhook_poll_s) == ("https://gpu.example/status", 0.25)
    assert (Settings.from_env({}).public_url, Settings.from_env({}).webhook_poll_s) == (None, 0.5)
    read.check()


@pytest.mark.parametrize(("env", "message"), [
    ({"COLLECTOR_PUBLIC_URL": "gpu.example"},
     "COLLECTOR_PUBLIC_URL must be an http:// or https:// URL, got 'gpu.example'"),
    ({"COLLECTOR_WEBHOOK_POLL_INTERVAL": "0"},
     "webhook_poll_s (COLLECTOR_WEBHOOK_POLL_INTERVAL) must be a positive number of seconds"),
])
def test_bad_webhook_settings_refuse_to_start(env, message):
    with pytest.raises(SettingsError, match=f"^{re.escape(message)}$"):
        Settings.from_env(env).check()
