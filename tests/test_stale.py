"""Stale jobs: out of Slurm's queue past the grace period, or silent too long, end failed; a real report still wins."""

from __future__ import annotations

import datetime as dt
import re
import time
import uuid

from collector.store import stale
from tests.test_api_clusters import listing
from tests.test_api_clusters import reported
from tests.test_api_clusters import submit
from tests.test_api_jobs import detail
from tests.test_api_jobs import put


def tokens() -> dict:
    return {"write_token": "w-" + uuid.uuid4().hex, "read_token": "r-" + uuid.uuid4().hex}


def wait_for(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def stamp(moment: dt.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def last_report(message: str, before: dt.datetime, after: dt.datetime) -> str:
    """The "(last report X)" moment of ``message``, checked to be our clock between ``before`` and ``after``."""
    (moment,) = re.findall(r"\(last report (\S+)\)", message)
    assert before.replace(microsecond=0) <= utc(moment) <= after, (moment, before, after)
    return moment


def test_a_job_that_left_the_queue_is_failed_after_the_grace_period(serve, database):
    api = serve(**tokens(), stale_grace_s=1.0)
    submit(api, "5")
    before = now()
    put(api, "5", "benchmark", stage="benchmark", message="Running benchmark", metadata={"cluster": "c1"},
        updated_at="2026-12-03T08:10:00Z")
    after = now()
    reported(api, jobs=[{"job_id": "5", "state": "RUNNING"}], queried_job_ids=["5"])
    # Gone from squeue (the head node died with the batch script): not yet past the grace period.
    first_gone = reported(api, jobs=[], queried_job_ids=["5"])
    assert detail(api, "5")["status"] == "benchmark"
    gone_since = detail(api, "5")["slurm"]["gone_since"]
    assert gone_since is not None and utc(gone_since) >= utc(first_gone["probed_at"])
    time.sleep(1.1)
    answer = reported(api, jobs=[], queried_job_ids=["5"])
    assert answer["watch"] == [] and answer["active_jobs"] == []
    job = detail(api, "5")
    assert (job["status"], job["stage"]) == ("failed", "benchmark")  # failed in the stage it was last in
    # "last report" is when the PUT arrived (our clock), not the reporter's 08:10 stamp.
    heard = last_report(job["message"], before, after)
    assert job["message"] == (f"The job left Slurm's queue by {gone_since[:19]}Z (last seen RUNNING) and it sent "
                              f"no final report (last report {heard}); marked failed by the collector")
    assert [(e["status"], e["message"]) for e in job["events"]][-1] == ("failed", job["message"])
    assert listing(api)[0]["statuses"] == {"failed": 1}
    database.assert_counts_match_jobs()
    # The next probe finds nothing left to do, and no second event appears.
    reported(api, jobs=[], queried_job_ids=["5"])
    assert len(detail(api, "5")["events"]) == len(job["events"])
    # A later real report still wins.
    put(api, "5", "completed", stage="cleanup", message="Benchmark completed successfully", exit_code=0,
        metadata={"cluster": "c1"}, updated_at="2026-12-03T08:30:00Z")
    assert (detail(api, "5")["status"], detail(api, "5")["exit_code"]) == ("completed", 0)
    database.assert_counts_match_jobs()


def test_slurm_s_own_verdict_is_named(serve):
    api = serve(**tokens(), stale_grace_s=1.0)
    before = now()
    submit(api, "6")
    after = now()
    reported(api, jobs=[{"job_id": "6", "state": "CANCELLED", "reason": "None"}], queried_job_ids=["6"])
    time.sleep(1.1)
    reported(api, jobs=[{"job_id": "6", "state": "CANCELLED"}], queried_job_ids=["6"])
    job = detail(api, "6")
    gone = job["slurm"]["gone_since"][:19] + "Z"
    assert (job["status"], job["stage"]) == ("failed", None)
    heard = last_report(job["message"], before, after)
    assert job["message"] == (f"Slurm reported the job CANCELLED at {gone} and it sent no final report "
                              f"(last report {heard}); marked failed by the collector")


def test_a_job_still_in_the_queue_or_still_reporting_is_left_alone(serve):
    api = serve(**tokens(), stale_grace_s=1.0)
    submit(api, "7")
    submit(api, "8")
    reported(api, jobs=[{"job_id": "7", "state": "PENDING", "reason": "Priority"}], queried_job_ids=["7", "8"])
    time.sleep(1.1)
    # 8 left the queue over a second ago but reported just now: not stale, even though the
    # report is stamped long before (a reporter whose clock is behind, an outbox replay).
    put(api, "8", "workers", metadata={"cluster": "c1"}, updated_at="2026-12-03T08:05:00Z")
    reported(api, jobs=[{"job_id": "7", "state": "PENDING", "reason": "Priority"}], queried_job_ids=["7", "8"])
    assert (detail(api, "7")["status"], detail(api, "8")["status"]) == ("submitted", "workers")


def test_the_janitor_fails_a_silent_job_without_any_probe(serve, database):
    api = serve(**tokens(), stale_silence_s=2.0, stale_check_s=0.2)
    before = now()
    submit(api, "9")
    after = now()
    # 10 keeps reporting, always with its submission's old stamp: arrivals count, not stamps.
    submit(api, "10")
    # 11 sends nothing but log bytes: a job whose logs flow is alive.
    submit(api, "11")
    offset = 0

    def silent_one_failed():
        nonlocal offset
        assert put(api, "10", "workers", metadata={"cluster": "c1"}, updated_at="2026-12-03T08:00:00Z").status_code == 200
        chunk = b"still here\n"
        assert api.post("/api/jobs/11/logs", params={"file": "a.out", "offset": offset, "cluster": "c1"},
                        data=chunk).status_code == 200
        offset += len(chunk)
        time.sleep(0.2)
        return (found := detail(api, "9"))["status"] == "failed" and found

    job = wait_for(silent_one_failed)
    assert job, "the janitor did not mark the silent job"
    (since,) = re.findall(r"since (\S+) ", job["message"])
    assert before.replace(microsecond=0) <= utc(since) <= after  # when the POST arrived
    assert job["message"] == (f"No report from the job since {since} (nothing for more than 2 s); "
                              "marked failed by the collector")
    assert (detail(api, "10")["status"], detail(api, "11")["status"]) == ("workers", "submitted")
    database.assert_counts_match_jobs()


def test_old_stamps_do_not_make_a_new_arrival_silent(serve, database):
    # A job POSTed today with a submission stamped years ago (a replay, a wrong clock) has
    # just been heard from: the silence rule must not fail it on arrival.
    api = serve(**tokens(), stale_silence_s=3600, stale_check_s=0.1)
    submit(api, "14", submitted_at="2020-01-01T00:00:00Z")
    put(api, "15", "benchmark", metadata={"cluster": "c1"}, updated_at="2020-01-01T00:05:00Z")
    with database.engine.connect() as conn:
        assert stale.candidates(conn, now(), grace_s=120, silence_s=3600) == []
        found = stale.candidates(conn, now() + dt.timedelta(seconds=3601), grace_s=120, silence_s=3600)
    assert sorted((c.job_id, c.rule) for c in found) == [("14", "silent"), ("15", "silent")]
    time.sleep(0.5)  # the janitor has run a few times meanwhile
    assert (detail(api, "14")["status"], detail(api, "15")["status"]) == ("submitted", "benchmark")


def test_silence_zero_turns_the_rule_off(serve):
    api = serve(**tokens(), stale_silence_s=0, stale_check_s=0.1)
    submit(api, "12", submitted_at="2020-01-01T00:00:00Z")
    api.get("/api/clusters")  # a request starts the janitor
    time.sleep(0.5)
    assert detail(api, "12")["status"] == "submitted"


def test_a_report_between_reading_and_marking_wins(serve, database):
    api = serve(**tokens(), stale_silence_s=0)  # its own janitor must not get there first
    submit(api, "13")
    later = now() + dt.timedelta(seconds=2)  # a sweep that finds 13 silent for over a second
    with database.engine.connect() as conn:
        (candidate,) = stale.candidates(conn, later, grace_s=120, silence_s=1.0)
    # Stamped before the submission, so updated_at does not move: the arrival still counts.
    put(api, "13", "workers", metadata={"cluster": "c1"}, updated_at="2026-12-03T07:59:00Z")
    with database.engine.begin() as conn:
        assert stale.mark(conn, candidate, later) is None
    assert detail(api, "13")["status"] == "workers"


def test_a_mark_keeps_the_last_report_s_stamp_so_newer_reports_win_and_older_ones_do_not(serve, database):
    api = serve(**tokens(), stale_silence_s=0)  # marked by hand below, not by its janitor
    submit(api, "16")
    put(api, "16", "benchmark", stage="benchmark", message="Running benchmark", metadata={"cluster": "c1"},
        updated_at="2026-12-03T08:10:00Z")
    later = now() + dt.timedelta(seconds=2)
    with database.engine.connect() as conn:
        (candidate,) = stale.candidates(conn, later, grace_s=120, silence_s=1.0)
    with database.engine.begin() as conn:
        assert stale.mark(conn, candidate, later).event is not None
    marked = detail(api, "16")
    assert (marked["status"], marked["stage"], marked["message"]) == ("failed", "benchmark", candidate.message)
    # The watermark stays the reporter's stamp; only the mark's event carries our clock.
    assert marked["updated_at"] == "2026-12-03T08:10:00Z"
    assert utc(marked["events"][-1]["created_at"]) == later
    # Older than the last real report: late, even though the mark came after it.
    late = put(api, "16", "frontend", stage="frontend", message="Inference endpoint ready",
               metadata={"cluster": "c1"}, updated_at="2026-12-03T08:09:59Z")
    assert (late.status_code, late.json()) == (200, {"job_id": "16", "status": "failed", "cluster": "c1"})
    assert detail(api, "16") == marked
    assert listing(api)[0]["statuses"] == {"failed": 1}
    database.assert_counts_match_jobs()
    # Not older than the last real report: it wins, though stamped hours before the mark on our clock.
    won = put(api, "16", "completed", stage="cleanup", message="Benchmark completed successfully", exit_code=0,
              metadata={"cluster": "c1"}, updated_at="2026-12-03T08:10:00Z")
    assert won.json() == {"job_id": "16", "status": "completed", "cluster": "c1"}
    job = detail(api, "16")
    assert [(e["status"], e["stage"], e["message"]) for e in job["events"]] == [
        ("submitted", None, None),
        ("benchmark", "benchmark", "Running benchmark"),
        ("failed", "benchmark", candidate.message),
        ("completed", "cleanup", "Benchmark completed successfully"),
    ]
    assert (job["exit_code"], job["updated_at"]) == (0, "2026-12-03T08:10:00Z")
    assert listing(api)[0]["statuses"] == {"completed": 1}
    database.assert_counts_match_jobs()
