"""The readers (`collector jobs`, `show`, `logs`, `events`) run as a person runs them, against a live collector."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import time
import uuid

import pytest

from tests.helpers import Restartable
from tests.helpers import put
from tests.helpers import submit
from tests.helpers import wait_for
from tests.processes import child_env
from tests.processes import collector_command
from tests.processes import run

OCTET = {"Content-Type": "application/octet-stream"}
HEAVY = ("flask", "sqlalchemy", "psycopg", "pydantic", "requests", "gunicorn", "alembic", "werkzeug", "textual",
         "rich")


@pytest.fixture
def api(serve):
    return serve(write_token="w-" + uuid.uuid4().hex, read_token="r-" + uuid.uuid4().hex)


def reader(api, *args: str, token: str | None = "read", **env: str) -> subprocess.CompletedProcess:
    """``collector ARGS`` with the endpoint in COLLECTOR_ENDPOINT and the read (or write) token in the environment."""
    tokens = {"read": {"SRTCTL_STATUS_READ_TOKEN": api.settings.read_token},
              "write": {"SRTCTL_STATUS_TOKEN": api.token}, None: {}}[token]
    return run(collector_command(*args), child_env(COLLECTOR_ENDPOINT=api.url, **tokens, **env), timeout=60)


def seed(api) -> None:
    """Two jobs on two clusters, one failed after three events; the same id on both clusters."""
    submit(api, "101", cluster="b200", submitted_at="2026-12-03T08:00:00Z")
    assert put(api, "101", "starting", stage="starting", message="Job started on node-01",
               updated_at="2026-12-03T08:01:30Z", metadata={"cluster": "b200"}).status_code == 200
    assert put(api, "101", "failed", message="OOM on node-3", exit_code=137, updated_at="2026-12-03T09:04:00Z",
               metadata={"cluster": "b200", "tags": ["sweep:a"]}).status_code == 200
    submit(api, "202", cluster="h100", submitted_at="2026-12-03T08:30:00Z")
    submit(api, "101", cluster="h100", submitted_at="2026-12-03T07:00:00Z")


def test_jobs_prints_a_table_and_json_that_is_the_api_s(api):
    seed(api)
    done = reader(api, "jobs")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "JOB  CLUSTER  STATUS        STAGE  NAME   UPDATED               MESSAGE",
        "202  h100     submitted     -      n-202  2026-12-03T08:30:00Z  -",
        "101  b200     failed (137)  -      n-101  2026-12-03T09:04:00Z  OOM on node-3",
        "101  h100     submitted     -      n-101  2026-12-03T07:00:00Z  -",
    ]
    as_json = reader(api, "jobs", "--json", "--cluster", "b200", "--status", "failed", "-q", "n-1")
    assert as_json.returncode == 0, as_json.stderr
    expected = api.get("/api/jobs", params={"cluster": "b200", "status": "failed", "q": "n-1", "per_page": 50,
                                            "page": 1}).json()
    assert json.loads(as_json.stdout) == expected
    assert [job["job_id"] for job in expected["jobs"]] == ["101"]


def test_jobs_pages_say_what_comes_next(api):
    seed(api)
    done = reader(api, "jobs", "--limit", "2")
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["JOB", "202", "101"]
    assert done.stderr == "page 1, 2 of 3 jobs; next: --page 2\n"
    last = reader(api, "jobs", "--limit", "2", "--page", "2")
    assert [line.split()[:2] for line in last.stdout.splitlines()] == [["JOB", "CLUSTER"], ["101", "h100"]]
    assert last.stderr == ""


def test_show_prints_facts_metadata_and_the_timeline_with_the_time_between_events(api):
    seed(api)
    done = reader(api, "show", "101", "--cluster", "b200")
    assert done.returncode == 0, done.stderr
    detail = api.get("/api/jobs/101", params={"cluster": "b200"}).json()
    assert detail["metadata"] == {"cluster": "b200", "tags": ["sweep:a"]}
    events = detail["events"]
    ids = [str(e["id"]) for e in events]
    width = max(len(i) for i in ids + ["ID"])
    assert done.stdout == "\n".join([
        "Job:        101",
        "Name:       n-101",
        "Cluster:    b200",
        "Status:     failed (137)",
        "Stage:      -",
        "Message:    OOM on node-3",
        "Submitted:  2026-12-03T08:00:00Z",
        "Started:    -",
        "Completed:  -",
        "Updated:    2026-12-03T09:04:00Z",
        "Recipe:     -",
        "Logs:       -",
        "",
        "Metadata:",
        # As the API gives it: PostgreSQL's jsonb orders the keys its own way.
        *("  " + line for line in json.dumps(detail["metadata"], indent=2).splitlines()),
        "",
        "Events:",
        f"  {'ID'.ljust(width)}  TIME                  SINCE   STATUS     STAGE     MESSAGE",
        f"  {ids[0].ljust(width)}  2026-12-03T08:00:00Z  -       submitted  -         -",
        f"  {ids[1].ljust(width)}  2026-12-03T08:01:30Z  +1m30s  starting   starting  Job started on node-01",
        f"  {ids[2].ljust(width)}  2026-12-03T09:04:00Z  +1h02m  failed     -         OOM on node-3",
    ]) + "\n"
    as_json = reader(api, "show", "101", "--cluster", "b200", "--json")
    assert json.loads(as_json.stdout) == api.get("/api/jobs/101", params={"cluster": "b200"}).json()


def test_a_job_on_two_clusters_asks_which_and_an_unknown_one_says_so(api):
    seed(api)
    both = reader(api, "show", "101")
    assert both.returncode == 1 and both.stdout == ""
    assert both.stderr.startswith("Error: job 101 exists on several clusters")
    assert both.stderr.rstrip().endswith("(give --cluster b200 or h100)")
    missing = reader(api, "show", "999")
    assert (missing.returncode, missing.stderr) == (1, "Error: job 999 not found (404)\n")


def upload(api, job_id: str, file: str, offset: int, data: bytes, *, final: bool = False) -> None:
    params = {"file": file, "offset": offset, "cluster": "b200", **({"final": 1} if final else {})}
    response = api.post(f"/api/jobs/{job_id}/logs", params=params, data=data, headers=dict(OCTET))
    assert response.status_code == 200, response.text


def test_logs_prints_the_file_and_follows_it_until_the_job_finishes(api):
    submit(api, "303", cluster="b200")
    text = "".join(f"line {n}\n" for n in range(1, 16))
    upload(api, "303", "worker.out", 0, text.encode())
    whole = reader(api, "logs", "303", "worker.out")
    assert (whole.returncode, whole.stdout) == (0, text)
    env = child_env(COLLECTOR_ENDPOINT=api.url, SRTCTL_STATUS_READ_TOKEN=api.settings.read_token)
    with subprocess.Popen(collector_command("logs", "303", "worker.out", "-f"), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as follower:
        time.sleep(1.5)
        upload(api, "303", "worker.out", len(text), "línea 16 — ünïcode\n".encode())
        time.sleep(1.5)
        assert put(api, "303", "completed", exit_code=0, updated_at="2026-12-03T09:00:00Z",
                   metadata={"cluster": "b200"}).status_code == 200
        out, err = follower.communicate(timeout=15)
    # tail -f: the last 10 lines, then what arrived, then it ends with the job.
    assert (follower.returncode, err) == (0, "")
    assert out == "".join(f"line {n}\n" for n in range(6, 16)) + "línea 16 — ünïcode\n"
    again = reader(api, "logs", "303", "worker.out", "-f", "--from-start")
    assert (again.returncode, again.stdout) == (0, text + "línea 16 — ünïcode\n")
    unknown = reader(api, "logs", "303", "nope.out", "-f")
    assert (unknown.returncode, unknown.stderr) == (1, "Error: job 303 has no log file 'nope.out' "
                                                       "(its files: worker.out)\n")


def test_events_prints_the_feed_and_json_lines_that_are_the_api_s(api):
    seed(api)
    feed = api.get("/api/events", params={"after": 0, "limit": 100}).json()["events"]
    lines = reader(api, "events", "--cluster", "b200")
    assert lines.returncode == 0, lines.stderr
    assert lines.stdout.splitlines() == [
        f"{feed[0]['id']}\t2026-12-03T08:00:00Z\tb200/101\tsubmitted\t-\t",
        f"{feed[1]['id']}\t2026-12-03T08:01:30Z\tb200/101\tstarting\tstarting\tJob started on node-01",
        f"{feed[2]['id']}\t2026-12-03T09:04:00Z\tb200/101\tfailed\t-\tOOM on node-3",
    ]
    as_json = reader(api, "events", "--json", "--after", str(feed[0]["id"]))
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == feed[1:]


def test_events_follow_prints_new_events_live_and_resumes_from_where_it_was(api):
    seed(api)
    newest = api.get("/api/events", params={"after": 0, "limit": 100}).json()["events"][-1]["id"]
    env = child_env(COLLECTOR_ENDPOINT=api.url, SRTCTL_STATUS_READ_TOKEN=api.settings.read_token)
    with subprocess.Popen(collector_command("events", "-f", "--json", "--after", str(newest - 1)), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as follower:
        assert follower.stdout is not None
        seen: list[dict] = []
        lines = follower.stdout
        reading = threading.Thread(target=lambda: seen.extend(json.loads(line) for line in lines), daemon=True)
        reading.start()
        wait_for(lambda: [e["id"] for e in seen] == [newest], 10, "the replayed event")
        started = time.monotonic()
        assert put(api, "202", "workers", message="live", updated_at="2026-12-03T09:10:00Z",
                   metadata={"cluster": "h100"}).status_code == 200
        wait_for(lambda: len(seen) == 2, 5, "the live event")
        assert time.monotonic() - started < 2
        follower.terminate()
        follower.wait(10)
    assert [(e["job_id"], e["status"], e["message"]) for e in seen[1:]] == [("202", "workers", "live")]



def test_events_into_a_pipe_whose_reader_stopped_ends_quietly(api):
    # `collector events -f | head -1`: head exits after its line, and the next event the
    # follower writes meets a closed pipe. It ends there, exit 1, with nothing on stderr.
    seed(api)
    env = child_env(COLLECTOR_ENDPOINT=api.url, SRTCTL_STATUS_READ_TOKEN=api.settings.read_token)
    with subprocess.Popen(collector_command("events", "-f", "--after", "0"), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as follower:
        assert follower.stdout is not None and follower.stderr is not None
        assert follower.stdout.readline().split(b"\t")[2] == b"b200/101"
        follower.stdout.close()
        for n in range(3):  # more than the pipe holds before it is known closed: any write fails
            assert put(api, "202", "workers", message=f"after the reader left {n}", updated_at="2026-12-03T09:10:00Z",
                       metadata={"cluster": "h100"}).status_code == 200
        assert follower.wait(30) == 1
        assert follower.stderr.read() == b""


def test_errors_say_what_to_fix_and_never_show_a_traceback(api):
    seed(api)
    no_token = reader(api, "jobs", token=None)
    assert no_token.returncode == 1 and "Traceback" not in no_token.stderr
    assert no_token.stderr.startswith(f"Error: the collector at {api.url} wants a token (401: ")
    assert no_token.stderr.rstrip().endswith("set SRTCTL_STATUS_READ_TOKEN (or SRTCTL_STATUS_TOKEN)")
    wrong = reader(api, "jobs", token=None, SRTCTL_STATUS_READ_TOKEN="not-it")
    assert wrong.returncode == 1 and "401" in wrong.stderr and "Traceback" not in wrong.stderr
    write = reader(api, "jobs", "--json", token="write")  # only the write token set: it reads too
    assert write.returncode == 0 and json.loads(write.stdout)["total"] == 3
    gone = reader(api, "jobs", "--endpoint", "http://127.0.0.1:9")
    assert gone.returncode == 1 and "Traceback" not in gone.stderr
    assert gone.stderr.startswith("Error: cannot reach the collector at http://127.0.0.1:9: ")
    not_url = reader(api, "jobs", "--endpoint", "collector:8080")
    assert (not_url.returncode, not_url.stderr) == (
        1, "Error: --endpoint 'collector:8080' is not an http(s) URL (e.g. http://127.0.0.1:8080)\n")


def test_a_redirect_is_refused_and_says_where_it_led(api):
    class Redirecting(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(302)
            self.send_header("Location", api.url + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        moved = reader(api, "jobs", "--endpoint", f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert moved.returncode == 1 and "Traceback" not in moved.stderr
    assert moved.stderr.startswith(f"Error: the collector at http://127.0.0.1:{server.server_port} redirected to "
                                   f"{api.url}/api/jobs?per_page=50&page=1 (302)")


def test_the_readers_load_none_of_the_server_s_packages(api):
    seed(api)
    code = ("import sys; from collector.cli import main\n"
            "try:\n    main(['jobs', '--json'])\nexcept SystemExit:\n    pass\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}), file=sys.stderr)")
    done = run([*collector_command()[:1], "-c", code], child_env(
        COLLECTOR_ENDPOINT=api.url, SRTCTL_STATUS_READ_TOKEN=api.settings.read_token))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total"] == 3
    assert done.stderr == "[]\n"


def test_events_follow_resumes_after_the_collector_restarts_without_losing_or_repeating(database):
    database.clean()
    collector = Restartable(database.url, "w-restart")
    follower = subprocess.Popen(collector_command("events", "-f", "--json"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=child_env(
                                    COLLECTOR_ENDPOINT=collector.url, SRTCTL_STATUS_TOKEN="w-restart"))
    seen: list[dict] = []
    lines = follower.stdout
    assert lines is not None
    threading.Thread(target=lambda: seen.extend(json.loads(line) for line in lines), daemon=True).start()
    try:
        time.sleep(1.5)  # the stream is open at the live edge
        collector.write("r1", "starting")
        wait_for(lambda: len(seen) == 1, 10, "the first event")
        collector.restart()
        for status in ("workers", "frontend", "benchmark"):  # before or after the follower is back
            collector.write("r1", status)
        wait_for(lambda: len(seen) >= 4, 45, "the events written after the restart")
        time.sleep(1.0)
    finally:
        follower.terminate()
        _, err = follower.communicate(timeout=10)
        collector.stop()
    assert [e["status"] for e in seen] == ["starting", "workers", "frontend", "benchmark"]
    assert [e["id"] for e in seen] == sorted({e["id"] for e in seen})
    assert "Traceback" not in err


def test_logs_follow_starts_at_the_last_ten_lines_even_when_its_window_cuts_a_character(api):
    submit(api, "404", cluster="b200")
    # 2 bytes, 9,000 lines of 8 bytes ("é" is 2), and an unfinished one of 1: the 64 KiB
    # window starts inside an "é". As tail, the unfinished line is the last of the ten.
    lines = [f"é{n:05d}\n" for n in range(9000)]
    data = ("xx" + "".join(lines) + "x").encode()
    assert (len(data) - 64 * 1024 - 2) % 8 == 1  # the second byte of a line's "é"
    upload(api, "404", "wide.out", 0, data, final=True)
    tail = reader(api, "logs", "404", "wide.out", "-f", "--cluster", "b200")
    assert (tail.returncode, tail.stdout) == (0, "".join(lines[-9:]) + "x")
