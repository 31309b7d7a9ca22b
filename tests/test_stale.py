"""Stale jobs: out of Slurm's queue past the grace period, or silent too long, end failed; a real report still wins.

No test sleeps through a grace or silence period: the janitor is given a FakeClock, moved to
the moment a sweep should look at, and the test waits for a sweep at that moment (so a check
that nothing was marked first proves the janitor looked). The exception is the sweep a probe
report runs at once, which reads the wall clock (collector/api/clusters.py): that test uses a
grace period of SHORT_GRACE_S and waits for the clock to pass it.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid

from collector.janitor import Janitor
from collector.janitor import Sweep
from collector.store import stale
from tests.helpers import FakeClock
from tests.helpers import detail
from tests.helpers import listing
from tests.helpers import put
from tests.helpers import reported
from tests.helpers import submit
from tests.helpers import wait_for

# The grace period of the tests where a probe report's own sweep marks the job: the
# clock has to pass it between two reports.
SHORT_GRACE_S = 0.01


def tokens() -> dict[str, str]:
    return {"write_token": "w-" + uuid.uuid4().hex, "read_token": "r-" + uuid.uuid4().hex}


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def stamp(moment: dt.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def swept_at(janitor: Janitor, clock: FakeClock, moment: dt.datetime) -> Sweep:
    """Move the janitor's clock to ``moment`` and wait until its thread has swept at that moment."""
    clock.set(moment)

    def swept() -> Sweep | None:
        last = janitor.last_sweep
        return last if last is not None and last.at == moment else None

    return wait_for(swept, what=f"the janitor to sweep at {moment}")


def last_report(message: str, before: dt.datetime, after: dt.datetime) -> str:
    """The "(last report X)" moment of ``message``, checked to be our clock between ``before`` and ``after``."""
    (moment,) = re.findall(r"\(last report (\S+)\)", message)
    assert before.replace(microsecond=0) <= utc(moment) <= after, (moment, before, after)
    return moment


def test_a_job_that_left_the_queue_is_failed_after_the_grace_period(serve, database):
    clock = FakeClock()
    api = serve(**tokens(), stale_grace_s=1.0, stale_check_s=0.05, clock=clock)
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
    # Half the grace period later the janitor looks, and leaves it alone.
    half = swept_at(api.janitor, clock, utc(gone_since) + dt.timedelta(seconds=0.5))
    assert (half.candidates, half.marked) == ((), 0)
    assert detail(api, "5")["status"] == "benchmark"
    # Past it, the janitor marks it failed.
    past = swept_at(api.janitor, clock, utc(gone_since) + dt.timedelta(seconds=1.1))
    assert ([c.job_id for c in past.candidates], past.marked) == (["5"], 1)
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
    # Marked by the sweep of the probe report that finds it stale: the janitor's own sweeps
    # happen before it all, on a clock that stands still.
    api = serve(**tokens(), stale_grace_s=SHORT_GRACE_S, clock=FakeClock())
    before = now()
    submit(api, "6")
    after = now()
    reported(api, jobs=[{"job_id": "6", "state": "CANCELLED", "reason": "None"}], queried_job_ids=["6"])
    gone_since = utc(detail(api, "6")["slurm"]["gone_since"])
    wait_for(lambda: now() - gone_since > dt.timedelta(seconds=SHORT_GRACE_S), what="the grace period to pass",
             every=0.001)
    reported(api, jobs=[{"job_id": "6", "state": "CANCELLED"}], queried_job_ids=["6"])
    job = detail(api, "6")
    gone = job["slurm"]["gone_since"][:19] + "Z"
    assert (job["status"], job["stage"]) == ("failed", None)
    heard = last_report(job["message"], before, after)
    assert job["message"] == (f"Slurm reported the job CANCELLED at {gone} and it sent no final report "
                              f"(last report {heard}); marked failed by the collector")


def test_a_job_still_in_the_queue_or_still_reporting_is_left_alone(serve):
    clock = FakeClock()
    api = serve(**tokens(), stale_grace_s=1.0, stale_check_s=0.05, clock=clock)
    submit(api, "7")
    submit(api, "8")
    reported(api, jobs=[{"job_id": "7", "state": "PENDING", "reason": "Priority"}], queried_job_ids=["7", "8"])
    gone_since = utc(detail(api, "8")["slurm"]["gone_since"])
    heard = now()
    # 8 left the queue over a second before the sweep below but reported since: not stale, even
    # though the report is stamped long before (a reporter whose clock is behind, an outbox replay).
    put(api, "8", "workers", metadata={"cluster": "c1"}, updated_at="2026-12-03T08:05:00Z")
    reported(api, jobs=[{"job_id": "7", "state": "PENDING", "reason": "Priority"}], queried_job_ids=["7", "8"])
    # A sweep a grace period after a moment between 8 leaving the queue and its report.
    sweep = swept_at(api.janitor, clock, gone_since + (heard - gone_since) / 2 + dt.timedelta(seconds=1.0))
    assert (sweep.candidates, sweep.marked) == ((), 0)
    assert (detail(api, "7")["status"], detail(api, "8")["status"]) == ("submitted", "workers")


def test_the_janitor_fails_a_silent_job_without_any_probe(serve, database):
    clock = FakeClock()
    api = serve(**tokens(), stale_silence_s=2.0, stale_check_s=0.05, clock=clock)
    before = now()
    submit(api, "9")
    after = now()
    submit(api, "10")
    submit(api, "11")
    heard = now()
    # 10 reports again, with its submission's old stamp: arrivals count, not stamps.
    assert put(api, "10", "workers", metadata={"cluster": "c1"}, updated_at="2026-12-03T08:00:00Z").status_code == 200
    # 11 sends nothing but log bytes: a job whose logs flow is alive.
    assert api.post("/api/jobs/11/logs", params={"file": "a.out", "offset": 0, "cluster": "c1"},
                    data=b"still here\n").status_code == 200
    # The janitor looks 2 s after 10 and 11 were last heard from: more than 2 s after 9 was.
    sweep = swept_at(api.janitor, clock, heard + dt.timedelta(seconds=2.0))
    assert ([c.job_id for c in sweep.candidates], sweep.marked) == (["9"], 1)
    job = detail(api, "9")
    assert job["status"] == "failed", "the janitor did not mark the silent job"
    (since,) = re.findall(r"since (\S+) ", job["message"])
    assert before.replace(microsecond=0) <= utc(since) <= after  # when the POST arrived
    assert job["message"] == (f"No report from the job since {since} (nothing for more than 2 s); "
                              "marked failed by the collector")
    assert (detail(api, "10")["status"], detail(api, "11")["status"]) == ("workers", "submitted")
    database.assert_counts_match_jobs()


def test_old_stamps_do_not_make_a_new_arrival_silent(serve, database):
    # A job POSTed today with a submission stamped years ago (a replay, a wrong clock) has
    # just been heard from: the silence rule must not fail it on arrival.
    clock = FakeClock()
    api = serve(**tokens(), stale_silence_s=3600, stale_check_s=0.05, clock=clock)
    submit(api, "14", submitted_at="2020-01-01T00:00:00Z")
    put(api, "15", "benchmark", metadata={"cluster": "c1"}, updated_at="2020-01-01T00:05:00Z")
    with database.engine.connect() as conn:
        assert stale.candidates(conn, now(), grace_s=120, silence_s=3600) == []
        found = stale.candidates(conn, now() + dt.timedelta(seconds=3601), grace_s=120, silence_s=3600)
    assert sorted((c.job_id, c.rule) for c in found) == [("14", "silent"), ("15", "silent")]
    # The janitor looks after both arrived, and leaves them alone.
    sweep = swept_at(api.janitor, clock, now())
    assert (sweep.candidates, sweep.marked) == ((), 0)
    assert (detail(api, "14")["status"], detail(api, "15")["status"]) == ("submitted", "benchmark")


def test_silence_zero_turns_the_rule_off(serve):
    clock = FakeClock()
    api = serve(**tokens(), stale_silence_s=0, stale_check_s=0.05, clock=clock)
    submit(api, "12", submitted_at="2020-01-01T00:00:00Z")
    api.get("/api/clusters")  # a request starts the janitor
    # Even a year on, the janitor finds nothing silent.
    sweep = swept_at(api.janitor, clock, now() + dt.timedelta(days=365))
    assert (sweep.candidates, sweep.marked) == ((), 0)
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
        result = stale.mark(conn, candidate, later)
        assert result is not None and result.event is not None
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
