"""/api/jobs/{id}/logs: offset-addressed uploads, resends, conflicts, EOF, UTF-8 reads and bad input."""

from __future__ import annotations

import datetime as dt
import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import raw_exchange

MiB = 1024 * 1024
MAX_OFFSET = 2**63 - 1
OCTET = {"Content-Type": "application/octet-stream"}


def upload(api, job_id, file, offset, data=b"", *, final=False, cluster=None, token=True):
    params = {"file": file, "offset": offset}
    if final:
        params["final"] = 1
    if cluster:
        params["cluster"] = cluster
    return api.post(f"/api/jobs/{job_id}/logs", params=params, data=data, headers=dict(OCTET), token=token)


def stored(api, job_id, file, offset, data=b"", **kwargs) -> int:
    """Upload one chunk that must be accepted; its ``stored`` flag."""
    response = upload(api, job_id, file, offset, data, **kwargs)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body == {"job_id": job_id, "stored": body["stored"]} and body["stored"] in (0, 1)
    return body["stored"]


def listing(api, job_id, **params) -> dict:
    """The file listing, each ``updated_at`` checked as an ISO 8601 timestamp and dropped."""
    response = api.get(f"/api/jobs/{job_id}/logs", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    for entry in body["files"]:
        assert dt.datetime.fromisoformat(entry.pop("updated_at").replace("Z", "+00:00")).tzinfo is not None
    return body


def files(api, job_id, **params) -> list[tuple[str, int, bool]]:
    return [(f["file"], f["size"], f["final"]) for f in listing(api, job_id, **params)["files"]]


def read(api, job_id, file, offset=None, **params) -> dict:
    params = {"file": file, **({"offset": offset} if offset is not None else {}), **params}
    response = api.get(f"/api/jobs/{job_id}/logs", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def content(api, job_id, file, **params) -> str:
    return read(api, job_id, file, **params)["data"]


# ---------------------------------------------------------------- upload and read back


def test_first_chunk_is_stored_listed_and_read(api):
    assert upload(api, "1", "a.out", 0, b"hello").json() == {"job_id": "1", "stored": 1}
    assert listing(api, "1") == {"job_id": "1", "cluster": None,
                                 "files": [{"file": "a.out", "size": 5, "final": False}]}
    assert read(api, "1", "a.out") == {"job_id": "1", "file": "a.out", "offset": 0, "next_offset": 5,
                                       "data": "hello", "size": 5, "final": False}


def test_appends_continue_the_file(api):
    assert stored(api, "1", "a.out", 0, b"hello ") == 1
    assert stored(api, "1", "a.out", 6, b"world") == 1
    assert read(api, "1", "a.out") == {"job_id": "1", "file": "a.out", "offset": 0, "next_offset": 11,
                                       "data": "hello world", "size": 11, "final": False}
    assert read(api, "1", "a.out", 6) == {"job_id": "1", "file": "a.out", "offset": 6, "next_offset": 11,
                                          "data": "world", "size": 11, "final": False}


def test_listing_is_sorted_by_file_name(api):
    """Code-point order, the same on every backend (a case- or punctuation-folding collation is not)."""
    names = ["worker/c.log", "b.err", "a.out", "metrics.jsonl", "B.out", "a_b.log", "a-b.log", "a/b.log", "é.log"]
    for name in names:
        stored(api, "1", name, 0, name.encode())
    assert files(api, "1") == [(name, len(name.encode()), False) for name in sorted(names)]


def test_interleaved_files_of_one_job_stay_apart(api):
    for name, offset, data in [("a.out", 0, b"a1"), ("b.err", 0, b"b1"), ("a.out", 2, b"a2"),
                               ("logs/c.log", 0, b"c1"), ("b.err", 2, b"b2"), ("a.out", 4, b"a3")]:
        assert stored(api, "1", name, offset, data) == 1
    assert files(api, "1") == [("a.out", 6, False), ("b.err", 4, False), ("logs/c.log", 2, False)]
    assert [content(api, "1", n) for n in ("a.out", "b.err", "logs/c.log")] == ["a1a2a3", "b1b2", "c1"]


def test_same_file_name_on_another_job_is_another_file(api):
    stored(api, "1", "a.out", 0, b"one")
    stored(api, "2", "a.out", 0, b"second")
    assert content(api, "1", "a.out") == "one" and content(api, "2", "a.out") == "second"


def test_file_name_of_4096_characters_is_accepted(api):
    name = "d/" + "x" * 4094
    assert stored(api, "1", name, 0, b"ok") == 1
    assert files(api, "1") == [(name, 2, False)]


@pytest.mark.parametrize("name", ["with space.out", "α/β.log", "100%.csv", "a+b.out", "q?x=1&y=2.out",
                                  "#hash.err", "é" * 4096, ".hidden/.x.log"])
def test_file_names_round_trip_verbatim(api, name):
    assert stored(api, "1", name, 0, b"ok") == 1
    assert listing(api, "1")["files"] == [{"file": name, "size": 2, "final": False}]
    assert read(api, "1", name)["file"] == name


def test_exact_1_mib_body_is_accepted(api):
    assert stored(api, "1", "a.out", 0, b"x" * MiB) == 1
    assert files(api, "1") == [("a.out", MiB, False)]


# ---------------------------------------------------------------- resends and conflicts


@pytest.mark.parametrize(
    "offset, data, flag, after",
    [
        (0, b"hello world", 0, "hello world"),    # the same chunk again
        (0, b"hello", 0, "hello world"),          # a prefix of it
        (3, b"lo wo", 0, "hello world"),          # a range inside it
        (6, b"world", 0, "hello world"),          # its tail
        (6, b"world!!", 1, "hello world!!"),      # overlaps identically, then extends
        (0, b"hello world, again", 1, "hello world, again"),
        (11, b"!", 1, "hello world!"),            # exactly at the end
    ],
)
def test_resend_stores_only_new_bytes(api, offset, data, flag, after):
    stored(api, "1", "a.out", 0, b"hello world")
    assert stored(api, "1", "a.out", offset, data) == flag
    assert read(api, "1", "a.out")["data"] == after
    assert files(api, "1") == [("a.out", len(after), False)]


def test_resend_across_two_stored_chunks_is_not_stored_again(api):
    stored(api, "1", "a.out", 0, b"hello ")
    stored(api, "1", "a.out", 6, b"world")
    assert stored(api, "1", "a.out", 4, b"o wor") == 0
    assert stored(api, "1", "a.out", 0, b"hello world") == 0
    assert content(api, "1", "a.out") == "hello world"


@pytest.mark.parametrize(
    "offset, data",
    [(0, b"HELLO"), (0, b"Hello world"), (1, b"E"), (3, b"LOxx"), (4, b"O!"), (4, b"O world")],
)
def test_conflicting_overlap_is_409_naming_file_and_range(api, offset, data):
    stored(api, "1", "logs/worker-x.err", 0, b"hello")
    response = upload(api, "1", "logs/worker-x.err", offset, data)
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert "logs/worker-x.err" in detail and re.search(rf"\b{offset}\b", detail), detail
    assert read(api, "1", "logs/worker-x.err") == {"job_id": "1", "file": "logs/worker-x.err", "offset": 0,
                                                   "next_offset": 5, "data": "hello", "size": 5, "final": False}


def test_conflict_with_a_chunk_beyond_a_gap_is_409_and_stores_nothing(api):
    stored(api, "1", "a.out", 0, b"hello")
    stored(api, "1", "a.out", 10, b"world")
    response = upload(api, "1", "a.out", 5, b"_____WORLD")
    assert response.status_code == 409 and "a.out" in response.json()["detail"]
    assert read(api, "1", "a.out")["data"] == "hello"
    assert files(api, "1") == [("a.out", 5, False)]


# ---------------------------------------------------------------- gaps


def test_bytes_after_a_gap_are_unreadable_until_it_is_filled(api):
    stored(api, "1", "a.out", 0, b"hello")
    assert stored(api, "1", "a.out", 10, b"world") == 1
    assert files(api, "1") == [("a.out", 5, False)]
    assert read(api, "1", "a.out") == {"job_id": "1", "file": "a.out", "offset": 0, "next_offset": 5,
                                       "data": "hello", "size": 5, "final": False}
    assert read(api, "1", "a.out", 10) == {"job_id": "1", "file": "a.out", "offset": 10, "next_offset": 10,
                                           "data": "", "size": 5, "final": False}
    assert stored(api, "1", "a.out", 10, b"world") == 0
    assert stored(api, "1", "a.out", 5, b"_____") == 1
    assert files(api, "1") == [("a.out", 15, False)]
    assert read(api, "1", "a.out")["data"] == "hello_____world"


def test_gap_filler_overlapping_the_later_chunk_identically_is_stored(api):
    stored(api, "1", "a.out", 0, b"hello")
    stored(api, "1", "a.out", 10, b"world")
    assert stored(api, "1", "a.out", 5, b"_____wor") == 1
    assert stored(api, "1", "a.out", 3, b"lo_____world!") == 1
    assert read(api, "1", "a.out")["data"] == "hello_____world!"
    assert files(api, "1") == [("a.out", 16, False)]


# ---------------------------------------------------------------- final


def test_final_marks_eof_at_the_end_of_the_chunk(api):
    assert stored(api, "1", "a.out", 0, b"abc", final=True) == 1
    assert files(api, "1") == [("a.out", 3, True)]
    assert read(api, "1", "a.out") == {"job_id": "1", "file": "a.out", "offset": 0, "next_offset": 3,
                                       "data": "abc", "size": 3, "final": True}
    assert stored(api, "1", "a.out", 0, b"abc", final=True) == 0
    assert stored(api, "1", "a.out", 0, b"abc") == 0
    assert stored(api, "1", "a.out", 1, b"bc") == 0
    assert files(api, "1") == [("a.out", 3, True)]


@pytest.mark.parametrize("offset, data", [(3, b""), (2, b"c"), (0, b"abc")])
def test_final_again_at_the_same_end_is_a_resend(api, offset, data):
    stored(api, "1", "a.out", 0, b"abc", final=True)
    assert stored(api, "1", "a.out", offset, data, final=True) == 0
    assert files(api, "1") == [("a.out", 3, True)]


@pytest.mark.parametrize("offset, data", [(0, b"ab"), (1, b""), (2, b"")])
def test_final_again_at_another_end_is_409(api, offset, data):
    """A file final at 3 bytes: final=1 ending before 3 contradicts it, as bytes past 3 do."""
    stored(api, "1", "a.out", 0, b"abc", final=True)
    response = upload(api, "1", "a.out", offset, data, final=True)
    assert response.status_code == 409, response.text
    assert "a.out" in response.json()["detail"]
    assert files(api, "1") == [("a.out", 3, True)]


def test_empty_final_body_finalizes(api):
    stored(api, "1", "a.out", 0, b"abc")
    assert stored(api, "1", "a.out", 3, b"", final=True) == 1
    assert files(api, "1") == [("a.out", 3, True)]
    assert stored(api, "1", "a.out", 3, b"", final=True) == 0
    assert read(api, "1", "a.out")["final"] is True


def test_final_on_a_resend_is_newly_stored(api):
    """Same bytes at the same offset, but the final flag is new: stored 1."""
    stored(api, "1", "a.out", 0, b"abc")
    assert stored(api, "1", "a.out", 0, b"abc", final=True) == 1
    assert files(api, "1") == [("a.out", 3, True)]


def test_empty_final_creates_an_empty_final_file(api):
    assert stored(api, "1", "empty.err", 0, b"", final=True) == 1
    assert files(api, "1") == [("empty.err", 0, True)]
    assert read(api, "1", "empty.err") == {"job_id": "1", "file": "empty.err", "offset": 0, "next_offset": 0,
                                           "data": "", "size": 0, "final": True}


@pytest.mark.parametrize("offset, data", [(0, b"hello"), (11, b""), (3, b"lo")])
def test_final_before_stored_bytes_is_409(api, offset, data):
    """final=1 at N while bytes past N are stored (even after a gap) would contradict them."""
    stored(api, "1", "a.out", 0, b"hello world")
    stored(api, "1", "a.out", 20, b"tail")
    response = upload(api, "1", "a.out", offset, data, final=True)
    assert response.status_code == 409, response.text
    assert "a.out" in response.json()["detail"]
    assert files(api, "1") == [("a.out", 11, False)]


def test_final_after_a_gap_holds_once_the_gap_is_filled(api):
    stored(api, "1", "a.out", 0, b"hello")
    assert stored(api, "1", "a.out", 10, b"world", final=True) == 1
    assert upload(api, "1", "a.out", 15, b"!").status_code == 409
    assert stored(api, "1", "a.out", 5, b"_____") == 1
    assert read(api, "1", "a.out") == {"job_id": "1", "file": "a.out", "offset": 0, "next_offset": 15,
                                       "data": "hello_____world", "size": 15, "final": True}


@pytest.mark.parametrize("offset, data", [(3, b"d"), (2, b"cd"), (0, b"abcd"), (10, b"x")])
def test_bytes_past_final_are_409(api, offset, data):
    stored(api, "1", "a.out", 0, b"abc", final=True)
    response = upload(api, "1", "a.out", offset, data)
    assert response.status_code == 409, response.text
    assert "a.out" in response.json()["detail"]
    assert read(api, "1", "a.out") == {"job_id": "1", "file": "a.out", "offset": 0, "next_offset": 3,
                                       "data": "abc", "size": 3, "final": True}


# ---------------------------------------------------------------- reads: UTF-8 and ranges

TEXT = "aé€😀z"  # 1-, 2-, 3- and 4-byte characters
ENCODED = TEXT.encode()


@pytest.mark.parametrize("split", range(1, len(ENCODED)))
def test_character_split_across_chunks_decodes_whole(api, split):
    stored(api, "1", "a.out", 0, ENCODED[:split])
    stored(api, "1", "a.out", split, ENCODED[split:])
    assert read(api, "1", "a.out") == {"job_id": "1", "file": "a.out", "offset": 0, "next_offset": len(ENCODED),
                                       "data": TEXT, "size": len(ENCODED), "final": False}


def test_incomplete_tail_waits_for_its_bytes_until_final(api):
    """Per prefix: data is the whole characters so far and next_offset stops before a partial one."""
    boundaries = [0]
    for char in TEXT:
        boundaries.append(boundaries[-1] + len(char.encode()))
    for n in range(1, len(ENCODED) + 1):
        name = f"p{n}.out"
        stored(api, "1", name, 0, ENCODED[:n])
        whole = max(b for b in boundaries if b <= n)
        assert read(api, "1", name) == {"job_id": "1", "file": name, "offset": 0, "next_offset": whole,
                                        "data": ENCODED[:whole].decode(), "size": n, "final": False}, n


@pytest.mark.parametrize("tail", ["é", "€", "😀"])
def test_incomplete_tail_of_a_final_file_is_replacement_character(api, tail):
    partial = b"caf" + tail.encode()[:-1]
    stored(api, "1", "a.out", 0, partial)
    assert read(api, "1", "a.out")["data"] == "caf"
    stored(api, "1", "a.out", len(partial), b"", final=True)
    assert read(api, "1", "a.out") == {"job_id": "1", "file": "a.out", "offset": 0, "next_offset": len(partial),
                                       "data": "caf\ufffd", "size": len(partial), "final": True}


@pytest.mark.parametrize(
    "raw, data",
    [(b"\xff", "\ufffd"), (b"ok\xff", "ok\ufffd"), (b"a\xffb", "a\ufffdb"), (b"\x80x", "\ufffdx"),
     (b"\xc3(", "\ufffd("), (b"\xfe\xff\xfe", "\ufffd\ufffd\ufffd")],
)
def test_invalid_bytes_read_as_replacement_characters(api, raw, data):
    stored(api, "1", "a.out", 0, raw)
    assert read(api, "1", "a.out") == {"job_id": "1", "file": "a.out", "offset": 0, "next_offset": len(raw),
                                       "data": data, "size": len(raw), "final": False}


def test_3_mib_file_reads_in_1_mib_pages(api):
    pages = [bytes([ord("a") + i]) * MiB for i in range(3)]
    for i, page in enumerate(pages):
        assert stored(api, "1", "big.log", i * MiB, page) == 1
    assert files(api, "1") == [("big.log", 3 * MiB, False)]
    offset = 0
    for page in pages:
        body = read(api, "1", "big.log", offset)
        assert (body["offset"], body["next_offset"], body["size"]) == (offset, offset + MiB, 3 * MiB)
        assert body["data"] == page.decode()
        offset = body["next_offset"]
    assert read(api, "1", "big.log", offset) == {"job_id": "1", "file": "big.log", "offset": 3 * MiB,
                                                 "next_offset": 3 * MiB, "data": "", "size": 3 * MiB,
                                                 "final": False}
    middle = read(api, "1", "big.log", MiB // 2 + 1)
    assert (middle["next_offset"], middle["data"] == (pages[0] + pages[1])[MiB // 2 + 1:][:MiB].decode()) == (
        MiB // 2 + 1 + MiB, True)


@pytest.mark.parametrize("final", [False, True])
def test_read_window_never_splits_a_character(api, final):
    """A 1 MiB window ending inside a character stops before it, final file or not; the next read has it whole."""
    stored(api, "1", "a.out", 0, b"a" * (MiB - 1) + "é".encode()[:1])
    stored(api, "1", "a.out", MiB, "é".encode()[1:] + b"bc", final=final)
    first = read(api, "1", "a.out")
    assert (first["next_offset"], first["data"] == "a" * (MiB - 1), first["final"]) == (MiB - 1, True, final)
    assert read(api, "1", "a.out", MiB - 1) == {"job_id": "1", "file": "a.out", "offset": MiB - 1,
                                                "next_offset": MiB + 3, "data": "ébc", "size": MiB + 3,
                                                "final": final}


@pytest.mark.parametrize("offset", [5, 6, 1000, MAX_OFFSET])
def test_read_at_or_beyond_the_end_is_empty(api, offset):
    stored(api, "1", "a.out", 0, b"hello")
    assert read(api, "1", "a.out", offset) == {"job_id": "1", "file": "a.out", "offset": offset,
                                               "next_offset": offset, "data": "", "size": 5, "final": False}


def test_job_without_logs_lists_none(api):
    api.post("/api/jobs", json={"job_id": "8", "job_name": "n", "submitted_at": "2025-01-26T10:30:00Z"})
    assert listing(api, "8") == {"job_id": "8", "cluster": None, "files": []}
    assert api.get("/api/jobs/8/logs", params={"file": "a.out"}).status_code == 404


def test_unknown_job_or_file_is_404(api):
    for params in ({}, {"file": "a.out"}):
        response = api.get("/api/jobs/nope/logs", params=params)
        assert response.status_code == 404
        assert response.json()["detail"] == "job nope not found"
    stored(api, "1", "a.out", 0, b"x")
    response = api.get("/api/jobs/1/logs", params={"file": "b.out"})
    assert response.status_code == 404 and "detail" in response.json()


@pytest.mark.parametrize("offset", ["-1", "abc", "1.5", str(2**63)])
def test_bad_read_offset_is_422(api, offset):
    stored(api, "1", "a.out", 0, b"x")
    response = api.get("/api/jobs/1/logs", params={"file": "a.out", "offset": offset})
    assert response.status_code == 422, response.text
    assert "offset" in response.json()["detail"]


# ---------------------------------------------------------------- jobs, clusters, delete


def test_upload_to_an_unknown_job_creates_a_placeholder(api, database):
    stored(api, "900", "a.out", 0, b"x")
    job = api.get("/api/jobs/900").json()
    assert (job["job_id"], job["job_name"], job["status"], job["cluster"]) == ("900", "job-900", "submitted", None)
    assert api.get("/api/jobs").json()["total"] == 1
    database.assert_counts_match_jobs()


def test_upload_with_cluster_creates_the_placeholder_on_that_cluster(api):
    stored(api, "901", "a.out", 0, b"x", cluster="b200")
    job = api.get("/api/jobs/901", params={"cluster": "b200"}).json()
    assert (job["job_name"], job["status"], job["cluster"]) == ("job-901", "submitted", "b200")
    assert listing(api, "901")["cluster"] == "b200"


def test_clustered_upload_claims_the_cluster_less_row(api):
    stored(api, "902", "a.out", 0, b"x")
    stored(api, "902", "b.out", 0, b"y", cluster="b200")
    assert listing(api, "902", cluster="b200") == {"job_id": "902", "cluster": "b200", "files": [
        {"file": "a.out", "size": 1, "final": False}, {"file": "b.out", "size": 1, "final": False}]}
    assert api.get("/api/jobs").json()["total"] == 1


def test_upload_to_a_posted_job_keeps_it(api):
    api.post("/api/jobs", json={"job_id": "5", "job_name": "real", "cluster": "a",
                                "submitted_at": "2025-01-26T10:30:00Z"})
    stored(api, "5", "a.out", 0, b"x")
    assert api.get("/api/jobs").json()["total"] == 1
    assert api.get("/api/jobs/5").json()["job_name"] == "real"
    assert listing(api, "5")["cluster"] == "a"


def test_same_job_id_on_two_clusters_kept_apart(api):
    stored(api, "7", "a.out", 0, b"from a", cluster="a")
    stored(api, "7", "a.out", 0, b"from b, different", cluster="b")
    assert listing(api, "7", cluster="a") == {"job_id": "7", "cluster": "a",
                                              "files": [{"file": "a.out", "size": 6, "final": False}]}
    assert files(api, "7", cluster="b") == [("a.out", 17, False)]
    assert content(api, "7", "a.out", cluster="a") == "from a"
    assert content(api, "7", "a.out", cluster="b") == "from b, different"
    for response in (api.get("/api/jobs/7/logs"), api.get("/api/jobs/7/logs", params={"file": "a.out"}),
                     upload(api, "7", "a.out", 0, b"from a")):
        assert response.status_code == 409, response.text
        assert response.json()["clusters"] == ["a", "b"]
    assert api.get("/api/jobs/7/logs", params={"cluster": "nope"}).status_code == 404


def test_logs_and_captures_of_one_job_are_kept_apart(api):
    stored(api, "1", "out-0.parquet", 0, b"log text")
    capture = api.post("/api/jobs/1/captures", params={"file": "out-0.parquet", "offset": 0, "total": 3},
                       data=b"PAR", headers=dict(OCTET))
    assert capture.status_code == 200, capture.text
    stored(api, "1", "only.out", 0, b"x")
    assert files(api, "1") == [("only.out", 1, False), ("out-0.parquet", 8, False)]
    assert content(api, "1", "out-0.parquet") == "log text"
    captures = api.get("/api/jobs/1/captures").json()["files"]
    assert [(f["file"], f["size"], f["complete"]) for f in captures] == [("out-0.parquet", 3, True)]


def test_delete_with_cluster_removes_only_that_clusters_logs(api, database):
    stored(api, "7", "a.out", 0, b"on a", cluster="a")
    stored(api, "7", "a.out", 0, b"on b", cluster="b")
    assert api.delete("/api/jobs/7", params={"cluster": "a"}).status_code == 200
    assert listing(api, "7") == {"job_id": "7", "cluster": "b",
                                 "files": [{"file": "a.out", "size": 4, "final": False}]}
    assert content(api, "7", "a.out") == "on b"
    database.assert_counts_match_jobs()


def test_concurrent_uploads_of_a_new_job_make_one_job_and_one_file(api, database):
    """Chunks of one file, each sent twice, from many threads at once: no 5xx, nothing lost."""
    data = bytes(range(65, 91)) * 400
    pieces = [(i, data[i:i + 1000]) for i in range(0, len(data), 1000)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda p: upload(api, "c1", "a.out", p[0], p[1]), pieces * 2))
    assert [r.status_code for r in answers] == [200] * len(pieces) * 2
    assert sum(r.json()["stored"] for r in answers) == len(pieces)
    assert database.scalar("SELECT count(*) FROM jobs") == 1
    assert files(api, "c1") == [("a.out", len(data), False)]
    assert content(api, "c1", "a.out") == data.decode()


def test_delete_removes_the_logs(api):
    stored(api, "5", "old.out", 0, b"old", final=True)
    assert api.delete("/api/jobs/5").status_code == 200
    assert api.get("/api/jobs/5/logs").status_code == 404
    assert api.get("/api/jobs/5/logs", params={"file": "old.out"}).status_code == 404
    assert stored(api, "5", "new.out", 0, b"new") == 1
    assert files(api, "5") == [("new.out", 3, False)]
    assert api.get("/api/jobs/5").json()["job_name"] == "job-5"
    # The old name starts over too: offset 0 with other bytes is a fresh file, not a conflict.
    assert stored(api, "5", "old.out", 0, b"OLDER") == 1
    assert files(api, "5") == [("new.out", 3, False), ("old.out", 5, False)]


# ---------------------------------------------------------------- legacy JSON form


def legacy(api, job_id, chunks, cluster=None):
    body = {"chunks": chunks, **({"metadata": {"cluster": cluster}} if cluster else {})}
    return api.post(f"/api/jobs/{job_id}/logs", json=body)


def test_legacy_json_chunks_are_stored_as_utf8(api):
    response = legacy(api, "3", [{"file": "a.out", "offset": 0, "size": 5, "data": "hello"},
                                 {"file": "b.err", "offset": 0, "size": 10, "data": "héllo ✓"}], cluster="b200")
    assert response.status_code == 200, response.text
    assert response.json() == {"job_id": "3", "stored": 1}
    assert listing(api, "3") == {"job_id": "3", "cluster": "b200",
                                 "files": [{"file": "a.out", "size": 5, "final": False},
                                           {"file": "b.err", "size": 10, "final": False}]}
    assert content(api, "3", "b.err") == "héllo ✓"
    assert legacy(api, "3", [{"file": "a.out", "offset": 0, "size": 5, "data": "hello"}],
                  cluster="b200").json() == {"job_id": "3", "stored": 0}
    assert legacy(api, "3", [{"file": "a.out", "offset": 5, "size": 1, "data": "!"}],
                  cluster="b200").json() == {"job_id": "3", "stored": 1}
    assert content(api, "3", "a.out", cluster="b200") == "hello!"


def test_legacy_and_raw_uploads_share_the_file(api):
    stored(api, "3", "a.out", 0, b"caf")
    assert legacy(api, "3", [{"file": "a.out", "offset": 3, "size": 2, "data": "é"}]).json() == {
        "job_id": "3", "stored": 1}
    assert stored(api, "3", "a.out", 0, "café".encode()) == 0
    assert content(api, "3", "a.out") == "café"


def test_legacy_form_ignores_the_raw_form_query_but_takes_its_cluster(api):
    """Offsets live in the chunks: a stray ?offset= or ?file= is not the JSON form's to judge."""
    body = {"chunks": [{"file": "a.out", "offset": 0, "size": 2, "data": "hi"}]}
    response = api.post("/api/jobs/3/logs", params={"offset": "bad", "file": "../x", "cluster": "q"}, json=body)
    assert response.json() == {"job_id": "3", "stored": 1}
    assert listing(api, "3")["cluster"] == "q"


def test_legacy_chunks_are_all_or_nothing(api):
    stored(api, "3", "a.out", 0, b"hello")
    response = legacy(api, "3", [{"file": "new.out", "offset": 0, "size": 3, "data": "new"},
                                 {"file": "a.out", "offset": 5, "size": 1, "data": "!"},
                                 {"file": "a.out", "offset": 0, "size": 5, "data": "HELLO"}])
    assert response.status_code == 409, response.text
    assert "a.out" in response.json()["detail"]
    assert files(api, "3") == [("a.out", 5, False)]


@pytest.mark.parametrize(
    "chunk, word",
    [
        ({"file": "a.out", "offset": 0, "size": 5, "data": "héllo"}, "size"),
        ({"file": "a.out", "offset": 0, "size": 7, "data": "héllo"}, "size"),
        ({"file": "../a.out", "offset": 0, "size": 1, "data": "x"}, "file"),
        ({"file": "a.out", "offset": -1, "size": 1, "data": "x"}, "offset"),
        ({"offset": 0, "size": 1, "data": "x"}, "file"),
        ({"file": "a.out", "offset": MAX_OFFSET, "size": 1, "data": "x"}, "offset"),
        ({"file": "a.out", "offset": 0, "size": 1, "data": "\ud800"}, "utf-8"),
    ],
)
def test_bad_legacy_chunk_is_422(api, chunk, word):
    stored(api, "3", "seed.out", 0, b"s")
    # Sent as text: json.dumps keeps a lone surrogate as the escape \ud800, which has no UTF-8 form.
    response = api.post("/api/jobs/3/logs", data=json.dumps({"chunks": [chunk]}),
                        headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert word in response.json()["detail"].lower()
    assert files(api, "3") == [("seed.out", 1, False)]


# ---------------------------------------------------------------- bad input

BAD_FILES = ["", "/etc/passwd", "..", "../x", "a/../b", "a/..", ".", "./a", "a/./b", "a//b", "a/", "a\\b",
             "..\\x", "a\x00b", "x" * 4097, "é" * 4097]


@pytest.mark.parametrize("file", BAD_FILES + [None])
def test_bad_file_name_is_422(api, file):
    stored(api, "1", "seed.out", 0, b"s")
    params = {"offset": 0, **({"file": file} if file is not None else {})}
    response = api.post("/api/jobs/1/logs", params=params, data=b"x", headers=dict(OCTET))
    assert response.status_code == 422, response.text
    assert "file" in response.json()["detail"]
    assert files(api, "1") == [("seed.out", 1, False)]


@pytest.mark.parametrize(
    "offset, data",
    [(None, b"x"), ("-1", b"x"), ("1.5", b"x"), ("abc", b"x"), ("", b"x"), (str(2**63), b"x"),
     (str(2**70), b""), (str(MAX_OFFSET), b"x"), (str(MAX_OFFSET - 3), b"hello")],
)
def test_bad_offset_is_422(api, offset, data):
    stored(api, "1", "seed.out", 0, b"s")
    params = {"file": "a.out", **({"offset": offset} if offset is not None else {})}
    response = api.post("/api/jobs/1/logs", params=params, data=data, headers=dict(OCTET))
    assert response.status_code == 422, response.text
    assert "offset" in response.json()["detail"]
    assert files(api, "1") == [("seed.out", 1, False)]


def test_chunk_ending_exactly_at_the_largest_offset_is_accepted(api):
    assert stored(api, "1", "a.out", MAX_OFFSET - 5, b"hello") == 1
    assert files(api, "1") == [("a.out", 0, False)]


def test_bad_input_creates_no_placeholder(api, database):
    assert upload(api, "1", "../x", 0, b"x").status_code == 422
    assert upload(api, "1", "a.out", -1, b"x").status_code == 422
    assert api.get("/api/jobs/1").status_code == 404
    assert database.scalar("SELECT count(*) FROM jobs") == 0


@pytest.mark.parametrize("chunked", [False, True])
def test_body_over_1_mib_is_413(api, chunked):
    stored(api, "1", "seed.out", 0, b"s")
    body = b"x" * (MiB + 1)
    # A generator body goes out with Transfer-Encoding: chunked and no Content-Length.
    response = upload(api, "1", "a.out", 0, iter([body[:MiB], body[MiB:]]) if chunked else body)
    assert response.status_code == 413, response.text
    assert "1048576" in response.json()["detail"]
    assert files(api, "1") == [("seed.out", 1, False)]


def test_chunked_body_within_the_limit_is_stored(api):
    assert stored(api, "1", "a.out", 0, iter([b"hello ", b"world"])) == 1
    assert content(api, "1", "a.out") == "hello world"


def test_body_shorter_than_its_content_length_is_400_and_stores_nothing(api):
    stored(api, "1", "seed.out", 0, b"s")
    head = (b"POST /api/jobs/1/logs?file=a.out&offset=0 HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/octet-stream\r\nContent-Length: 100\r\n")
    reply = raw_exchange(api, head, b"0123456789", half_close=True)
    assert reply.startswith("HTTP/1.1 400"), reply
    assert files(api, "1") == [("seed.out", 1, False)]


# ---------------------------------------------------------------- auth


def test_writes_need_the_write_token(api):
    assert upload(api, "1", "a.out", 0, b"x", token=None).status_code == 401
    assert upload(api, "1", "a.out", 0, b"x", token="wrong").status_code == 401
    assert upload(api, "1", "a.out", 0, b"x", token=api.settings.read_token).status_code == 403
    assert api.get("/api/jobs/1").status_code == 404
    assert stored(api, "1", "a.out", 0, b"x") == 1


@pytest.mark.parametrize("params", [{}, {"file": "a.out"}])
def test_reads_take_either_token_and_not_none(api, params):
    stored(api, "1", "a.out", 0, b"x")
    assert api.get("/api/jobs/1/logs", params=params, token=None).status_code == 401
    assert api.get("/api/jobs/1/logs", params=params, token=api.settings.read_token).status_code == 200
    assert api.get("/api/jobs/1/logs", params=params).status_code == 200
