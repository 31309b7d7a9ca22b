"""/api/jobs/{id}/captures: sequential segment uploads, retries, conflicts, checksummed downloads."""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text

from tests.helpers import OCTET
from tests.helpers import MiB
from tests.helpers import accepted
from tests.helpers import raw_exchange
from tests.helpers import send

MAX_OFFSET = 2**63 - 1
SEGMENT = "out-0.parquet"


def listing(api, job_id, *, keep_times=False, **params) -> dict:
    """The segment listing; each ``updated_at`` checked as an ISO 8601 timestamp (dropped unless kept)."""
    response = api.get(f"/api/jobs/{job_id}/captures", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    for entry in body["files"]:
        assert dt.datetime.fromisoformat(entry["updated_at"].replace("Z", "+00:00")).tzinfo is not None
        if not keep_times:
            del entry["updated_at"]
    body["files"].sort(key=lambda f: f["file"])
    return body


def segments(api, job_id, **params) -> list[tuple[str, int, bool]]:
    return [(f["file"], f["size"], f["complete"]) for f in listing(api, job_id, **params)["files"]]


def download(api, job_id, file, method="GET", **params):
    return api.request(method, f"/api/jobs/{job_id}/captures", params={"file": file, **params})


def assert_downloads(api, job_id, file, data: bytes, **params) -> None:
    """GET gives exactly ``data`` with its length and checksum; HEAD the same headers and no body."""
    get = download(api, job_id, file, **params)
    assert get.status_code == 200, get.text
    assert get.content == data
    assert get.headers["Content-Type"] == "application/octet-stream"
    assert get.headers["Content-Length"] == str(len(data))
    assert get.headers["X-Checksum-SHA256"] == hashlib.sha256(data).hexdigest()
    head = download(api, job_id, file, "HEAD", **params)
    assert head.status_code == 200 and head.content == b""
    for name in ("Content-Type", "Content-Length", "X-Checksum-SHA256"):
        assert head.headers[name] == get.headers[name]


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


# ---------------------------------------------------------------- upload and download


def test_sequential_chunks_complete_the_segment(api):
    assert send(api, "1", SEGMENT, 0, 10, b"01234").json() == {"job_id": "1", "next_offset": 5, "complete": False}
    assert listing(api, "1") == {"job_id": "1", "cluster": None,
                                 "files": [{"file": SEGMENT, "size": 5, "complete": False}]}
    assert send(api, "1", SEGMENT, 5, 10, b"56789").json() == {"job_id": "1", "next_offset": 10, "complete": True}
    assert listing(api, "1") == {"job_id": "1", "cluster": None,
                                 "files": [{"file": SEGMENT, "size": 10, "complete": True}]}
    assert_downloads(api, "1", SEGMENT, b"0123456789")


def test_single_chunk_segment_is_complete_at_once(api):
    accepted(api, "1", SEGMENT, 0, 4, b"PAR1")
    assert segments(api, "1") == [(SEGMENT, 4, True)]
    assert_downloads(api, "1", SEGMENT, b"PAR1")


def test_checksum_is_recorded_once_the_segment_completes(api, database):
    accepted(api, "1", SEGMENT, 0, 8, b"PAR1")
    assert database.scalar("SELECT sha256 FROM blob_files") is None
    accepted(api, "1", SEGMENT, 4, 8, b"PAR2")
    assert database.scalar("SELECT sha256 FROM blob_files") == hashlib.sha256(b"PAR1PAR2").hexdigest()


def test_download_seals_a_segment_whose_checksum_was_never_recorded(api, database):
    """The collector stopped between the last chunk's commit and its checksum: the download computes it."""
    accepted(api, "1", SEGMENT, 0, 8, b"PAR1PAR2")
    with database.engine.begin() as conn:
        conn.execute(text("UPDATE blob_files SET sha256 = NULL"))
    assert_downloads(api, "1", SEGMENT, b"PAR1PAR2")
    assert database.scalar("SELECT sha256 FROM blob_files") == hashlib.sha256(b"PAR1PAR2").hexdigest()


def test_retrying_the_last_chunk_keeps_the_checksum(api, database):
    accepted(api, "1", SEGMENT, 0, 4, b"PAR1")
    accepted(api, "1", SEGMENT, 0, 4, b"PAR1")
    assert database.scalar("SELECT sha256 FROM blob_files") == hashlib.sha256(b"PAR1").hexdigest()
    assert_downloads(api, "1", SEGMENT, b"PAR1")


def test_3_mib_in_1_mib_chunks_round_trips_exactly(api):
    data = blob(3 * MiB)
    for i in range(3):
        accepted(api, "1", SEGMENT, i * MiB, 3 * MiB, data[i * MiB:(i + 1) * MiB])
    assert segments(api, "1") == [(SEGMENT, 3 * MiB, True)]
    response = download(api, "1", SEGMENT)
    assert response.headers["X-Checksum-SHA256"] == hashlib.sha256(data).hexdigest()
    assert hashlib.sha256(response.content).hexdigest() == hashlib.sha256(data).hexdigest()
    assert_downloads(api, "1", SEGMENT, data)


def test_uneven_chunks_and_binary_bytes_round_trip(api):
    data = bytes(range(256)) * 5 + b"\x00\xff"
    offset = 0
    for size in (1, 255, 700, 300, 26):
        accepted(api, "1", SEGMENT, offset, len(data), data[offset:offset + size])
        offset += size
    assert offset == len(data)
    assert_downloads(api, "1", SEGMENT, data)


def test_interleaved_segments_of_one_job(api):
    first, second = blob(3000, 1), blob(2000, 2)
    accepted(api, "1", "out-0.parquet", 0, 3000, first[:1000])
    accepted(api, "1", "out-1.parquet", 0, 2000, second[:1000])
    accepted(api, "1", "out-0.parquet", 1000, 3000, first[1000:2000])
    accepted(api, "1", "out-1.parquet", 1000, 2000, second[1000:])
    assert segments(api, "1") == [("out-0.parquet", 2000, False), ("out-1.parquet", 2000, True)]
    assert download(api, "1", "out-0.parquet").status_code == 404
    accepted(api, "1", "out-0.parquet", 2000, 3000, first[2000:])
    assert_downloads(api, "1", "out-0.parquet", first)
    assert_downloads(api, "1", "out-1.parquet", second)


# ---------------------------------------------------------------- retries and conflicts


def test_exact_retry_answers_again_and_changes_nothing(api):
    accepted(api, "1", SEGMENT, 0, 10, b"01234")
    before = listing(api, "1", keep_times=True)
    assert accepted(api, "1", SEGMENT, 0, 10, b"01234") == {"job_id": "1", "next_offset": 5, "complete": False}
    assert listing(api, "1", keep_times=True) == before
    accepted(api, "1", SEGMENT, 5, 10, b"56789")
    done = listing(api, "1", keep_times=True)
    assert accepted(api, "1", SEGMENT, 5, 10, b"56789") == {"job_id": "1", "next_offset": 10, "complete": True}
    assert listing(api, "1", keep_times=True) == done
    assert_downloads(api, "1", SEGMENT, b"0123456789")


def test_retry_of_an_earlier_chunk_answers_as_it_did_then(api):
    """The reporter checks next_offset == offset + len and complete == (end == total) on every answer."""
    accepted(api, "1", SEGMENT, 0, 10, b"01234")
    accepted(api, "1", SEGMENT, 5, 10, b"567")
    assert accepted(api, "1", SEGMENT, 0, 10, b"01234") == {"job_id": "1", "next_offset": 5, "complete": False}
    accepted(api, "1", SEGMENT, 8, 10, b"89")
    assert accepted(api, "1", SEGMENT, 5, 10, b"567") == {"job_id": "1", "next_offset": 8, "complete": False}
    assert segments(api, "1") == [(SEGMENT, 10, True)]


@pytest.mark.parametrize(
    "offset, total, data",
    [
        (0, 12, b"01234"),     # exact retry but another total
        (5, 12, b"56789"),     # the next chunk, another total
        (7, 10, b"789"),       # a gap after the end
        (0, 10, b"012"),       # overlap, shorter
        (0, 10, b"0123456"),   # overlap, longer
        (3, 10, b"3456"),      # overlap from inside
        (0, 10, b"abcde"),     # same range, other bytes
        (4, 10, b"4"),         # inside, not at the end
    ],
)
def test_chunk_that_is_neither_next_nor_an_exact_retry_is_409(api, offset, total, data):
    accepted(api, "1", SEGMENT, 0, 10, b"01234")
    response = send(api, "1", SEGMENT, offset, total, data)
    assert response.status_code == 409, response.text
    assert SEGMENT in response.json()["detail"]
    assert segments(api, "1") == [(SEGMENT, 5, False)]
    accepted(api, "1", SEGMENT, 5, 10, b"56789")
    assert_downloads(api, "1", SEGMENT, b"0123456789")


def test_first_chunk_not_at_zero_is_409(api):
    response = send(api, "1", SEGMENT, 5, 10, b"56789")
    assert response.status_code == 409, response.text
    assert SEGMENT in response.json()["detail"]


@pytest.mark.parametrize("offset, total, data", [(0, 12, b"0123456789"), (10, 12, b"ab"), (5, 10, b"56789")])
def test_changes_to_a_complete_segment_are_409(api, offset, total, data):
    accepted(api, "1", SEGMENT, 0, 10, b"0123456789")
    response = send(api, "1", SEGMENT, offset, total, data)
    assert response.status_code == 409, response.text
    assert segments(api, "1") == [(SEGMENT, 10, True)]
    assert_downloads(api, "1", SEGMENT, b"0123456789")


# ---------------------------------------------------------------- downloads that are not there


def test_job_without_captures_lists_none(api):
    api.post("/api/jobs", json={"job_id": "8", "job_name": "n", "cluster": "a",
                                "submitted_at": "2025-01-26T10:30:00Z"})
    assert listing(api, "8") == {"job_id": "8", "cluster": "a", "files": []}
    assert download(api, "8", SEGMENT).status_code == 404


def test_partial_or_unknown_segment_is_404(api):
    accepted(api, "1", SEGMENT, 0, 10, b"01234")
    for method in ("GET", "HEAD"):
        assert download(api, "1", SEGMENT, method).status_code == 404
        assert download(api, "1", "out-9.parquet", method).status_code == 404
        assert download(api, "nope", SEGMENT, method).status_code == 404
    for response in (api.get("/api/jobs/nope/captures"), download(api, "nope", SEGMENT)):
        assert response.status_code == 404 and response.json()["detail"] == "job nope not found"
    assert SEGMENT in download(api, "1", SEGMENT).json()["detail"]


# ---------------------------------------------------------------- clusters and delete


def test_same_job_id_on_two_clusters_kept_apart(api):
    on_a, on_b = blob(100, 3), blob(60, 4)
    accepted(api, "7", SEGMENT, 0, 100, on_a, cluster="a")
    accepted(api, "7", SEGMENT, 0, 60, on_b, cluster="b")
    assert listing(api, "7", cluster="a") == {"job_id": "7", "cluster": "a",
                                              "files": [{"file": SEGMENT, "size": 100, "complete": True}]}
    assert segments(api, "7", cluster="b") == [(SEGMENT, 60, True)]
    assert_downloads(api, "7", SEGMENT, on_a, cluster="a")
    assert_downloads(api, "7", SEGMENT, on_b, cluster="b")
    for response in (api.get("/api/jobs/7/captures"), download(api, "7", SEGMENT),
                     send(api, "7", "out-1.parquet", 0, 1, b"x")):
        assert response.status_code == 409, response.text
        assert response.json()["clusters"] == ["a", "b"]
    assert api.get("/api/jobs/7/captures", params={"cluster": "nope"}).status_code == 404


def test_delete_removes_the_captures(api):
    accepted(api, "5", SEGMENT, 0, 3, b"old")
    assert api.delete("/api/jobs/5").status_code == 200
    assert api.get("/api/jobs/5/captures").status_code == 404
    assert download(api, "5", SEGMENT).status_code == 404
    # The same name starts over: a new total and new bytes are a fresh segment, not a conflict.
    accepted(api, "5", SEGMENT, 0, 5, b"newer")
    assert segments(api, "5") == [(SEGMENT, 5, True)]
    assert_downloads(api, "5", SEGMENT, b"newer")


# ---------------------------------------------------------------- bad input

BAD_FILES = ["", "/etc/passwd", "..", "../out-0.parquet", "a/../b", ".", "./out-0.parquet", "a//b", "a/",
             "a\\b", "..\\x", "out\x00.parquet", "x" * 4097]


@pytest.mark.parametrize("file", BAD_FILES + [None])
def test_bad_file_name_is_422(api, file):
    params = {"offset": 0, "total": 1, **({"file": file} if file is not None else {})}
    response = api.post("/api/jobs/1/captures", params=params, data=b"x", headers=dict(OCTET))
    assert response.status_code == 422, response.text
    assert "file" in response.json()["detail"]


@pytest.mark.parametrize(
    "change, word",
    [
        ({"offset": None}, "offset"),
        ({"offset": "-1"}, "offset"),
        ({"offset": "1.5"}, "offset"),
        ({"offset": "abc"}, "offset"),
        ({"offset": str(2**63)}, "offset"),
        ({"total": None}, "total"),
        ({"total": "-1"}, "total"),
        ({"total": "1.5"}, "total"),
        ({"total": "ten"}, "total"),
        ({"total": str(2**63)}, "total"),
    ],
)
def test_bad_numbers_are_422(api, change, word):
    params = {k: v for k, v in {"file": SEGMENT, "offset": "0", "total": "1", **change}.items() if v is not None}
    response = api.post("/api/jobs/1/captures", params=params, data=b"x", headers=dict(OCTET))
    assert response.status_code == 422, response.text
    assert word in response.json()["detail"]


@pytest.mark.parametrize("offset, total, data", [(0, 10, b"0123456789a"), (0, 0, b"x"), (5, 8, b"5678")])
def test_chunk_past_total_is_422(api, offset, total, data):
    accepted(api, "1", "out-9.parquet", 0, 1, b"x")
    if offset:
        accepted(api, "1", SEGMENT, 0, total, b"01234")
    response = send(api, "1", SEGMENT, offset, total, data)
    assert response.status_code == 422, response.text
    assert "total" in response.json()["detail"]
    assert segments(api, "1") == [*([(SEGMENT, 5, False)] if offset else []), ("out-9.parquet", 1, True)]


def test_largest_total_and_offset_are_accepted(api):
    assert send(api, "1", SEGMENT, 0, MAX_OFFSET, b"PAR1").json() == {"job_id": "1", "next_offset": 4,
                                                                      "complete": False}
    assert send(api, "1", "out-1.parquet", MAX_OFFSET, MAX_OFFSET).status_code == 409  # not the segment's end
    assert segments(api, "1") == [(SEGMENT, 4, False)]


def test_bad_input_stores_nothing(api, database):
    assert send(api, "1", "../x", 0, 1, b"x").status_code == 422
    assert send(api, "1", SEGMENT, 0, 1, b"xy").status_code == 422
    assert database.scalar("SELECT count(*) FROM jobs") == 0


@pytest.mark.parametrize("chunked", [False, True])
def test_body_over_1_mib_is_413(api, chunked):
    body = b"x" * (MiB + 1)
    # A generator body goes out with Transfer-Encoding: chunked and no Content-Length.
    response = send(api, "1", SEGMENT, 0, 2 * MiB, iter([body[:MiB], body[MiB:]]) if chunked else body)
    assert response.status_code == 413, response.text
    assert "1048576" in response.json()["detail"]
    assert api.get("/api/jobs/1").status_code == 404


def test_body_shorter_than_its_content_length_is_400_and_stores_nothing(api):
    accepted(api, "1", "out-9.parquet", 0, 1, b"x")
    head = (f"POST /api/jobs/1/captures?file={SEGMENT}&offset=0&total=100 HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/octet-stream\r\nContent-Length: 100\r\n").encode()
    reply = raw_exchange(api, head, b"0123456789", half_close=True)
    assert reply.startswith("HTTP/1.1 400"), reply
    assert segments(api, "1") == [("out-9.parquet", 1, True)]


def test_concurrent_segments_of_a_new_job(api, database):
    """First chunks of many segments of an unknown job at once: one job, every segment whole."""
    data = {f"out-{n}.parquet": blob(5000 + n, n) for n in range(12)}
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda item: send(api, "c1", item[0], 0, len(item[1]), item[1]), data.items()))
    assert [r.status_code for r in answers] == [200] * len(data)
    assert database.scalar("SELECT count(*) FROM jobs") == 1
    assert segments(api, "c1") == sorted((name, len(b), True) for name, b in data.items())
    for name, b in data.items():
        assert download(api, "c1", name).content == b


# ---------------------------------------------------------------- auth


def test_writes_need_the_write_token(api):
    assert send(api, "1", SEGMENT, 0, 1, b"x", token=None).status_code == 401
    assert send(api, "1", SEGMENT, 0, 1, b"x", token="wrong").status_code == 401
    assert send(api, "1", SEGMENT, 0, 1, b"x", token=api.settings.read_token).status_code == 403
    assert api.get("/api/jobs/1").status_code == 404
    accepted(api, "1", SEGMENT, 0, 1, b"x")


def test_reads_take_either_token_and_not_none(api):
    accepted(api, "1", SEGMENT, 0, 1, b"x")
    for params in ({}, {"file": SEGMENT}):
        assert api.get("/api/jobs/1/captures", params=params, token=None).status_code == 401
        assert api.get("/api/jobs/1/captures", params=params, token=api.settings.read_token).status_code == 200
    for token, status in ((None, 401), (api.settings.read_token, 200)):
        assert api.request("HEAD", "/api/jobs/1/captures", params={"file": SEGMENT}, token=token).status_code == status
