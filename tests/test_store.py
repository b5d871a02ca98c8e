"""The row store without a model: torn and corrupt lines, failures, and several writers at once."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal

import pytest

from runners.store import RowStore, read_failures, read_rows


def row(i, **extra):
    return {"id": f"s{i}", "metrics": {"accuracy": 1.0}, **extra}


def lines(path):
    return path.read_bytes().splitlines(keepends=True)


def test_torn_last_line_is_cut_and_neighbours_stay_byte_for_byte(tmp_path, capsys):
    store = RowStore(tmp_path)
    store.open()
    for i in range(3):
        assert store.append(row(i))
    store.close()
    before = (tmp_path / "samples.jsonl").read_bytes()
    torn = json.dumps(row(3)).encode()[:17]                     # a kill in the middle of the 4th write
    with open(tmp_path / "samples.jsonl", "ab") as f:
        f.write(torn)
    assert [r["id"] for r in read_rows(tmp_path / "samples.jsonl")] == ["s0", "s1", "s2"]   # readers skip it

    again = RowStore(tmp_path)
    again.open()
    assert (tmp_path / "samples.jsonl").read_bytes() == before     # cut, nothing else touched
    assert (tmp_path / "samples.torn").read_bytes() == torn + b"\n"
    assert "torn last line" in capsys.readouterr().err
    assert again.done == {"s0", "s1", "s2"} and again.claim("s3")  # its sample runs again
    assert again.append(row(3))
    again.close()
    assert [r["id"] for r in read_rows(tmp_path / "samples.jsonl")] == ["s0", "s1", "s2", "s3"]


def test_corrupt_middle_line_is_moved_aside_and_rerun(tmp_path, capsys):
    good = [json.dumps(row(i)).encode() + b"\n" for i in range(4)]
    bad = b'{"id": "s1", "metrics": {"accur\x00\n'
    (tmp_path / "samples.jsonl").write_bytes(good[0] + bad + good[2] + good[3] + good[2])   # + a duplicate
    store = RowStore(tmp_path)
    store.open()
    err = capsys.readouterr().err
    assert "moved 1 line(s) that do not parse (line 2) to samples.corrupt" in err
    assert "moved 1 second row(s) for an id (line 5) to samples.duplicate" in err
    assert lines(tmp_path / "samples.jsonl") == [good[0], good[2], good[3]]
    assert (tmp_path / "samples.corrupt").read_bytes() == bad
    assert store.done == {"s0", "s2", "s3"}
    assert store.claim("s1") and store.append(row(1))             # appended once, not twice
    assert not store.append(row(1))
    store.close()
    ids = [json.loads(x)["id"] for x in lines(tmp_path / "samples.jsonl")]
    assert sorted(ids) == ["s0", "s1", "s2", "s3"]


def test_failures_are_kept_until_a_rerun_succeeds(tmp_path):
    store = RowStore(tmp_path)
    store.open()
    store.append(row(0))
    store.fail({"id": "s1", "status": "failed", "error": "OutOfMemoryError: first"})
    store.fail({"id": "s1", "status": "failed", "error": "OutOfMemoryError: second"})
    store.fail({"id": "s2", "status": "failed", "error": "ValueError: x"})
    done = {r["id"] for r in read_rows(tmp_path / "samples.jsonl")}
    assert [(f["id"], f["error"]) for f in read_failures(tmp_path / "failed.jsonl", done)] == [
        ("s1", "OutOfMemoryError: second"), ("s2", "ValueError: x")]           # last per id
    store.close()
    assert len(lines(tmp_path / "failed.jsonl")) == 2                       # compacted: one per id

    rerun = RowStore(tmp_path)
    rerun.open()
    assert rerun.claim("s1") and rerun.claim("s2") and not rerun.claim("s0")   # failed ids retried, done skipped
    rerun.append(row(1))
    rerun.close()
    done = {r["id"] for r in read_rows(tmp_path / "samples.jsonl")}
    assert [f["id"] for f in read_failures(tmp_path / "failed.jsonl", done)] == ["s2"]
    assert [json.loads(x)["id"] for x in lines(tmp_path / "failed.jsonl")] == ["s2"]


def _writer(directory, ids, queue, start):
    start.wait()
    store = RowStore(directory)
    store.open()
    computed = []
    for i in ids:
        if store.claim(i):
            computed.append(i)
            store.append({"id": i, "pad": "x" * 5000, "by": store.writer})   # long lines: interleaving would show
    store.close()
    queue.put(computed)


def test_concurrent_writers_split_the_work_and_never_duplicate(tmp_path):
    ctx = mp.get_context("fork")
    ids = [f"s{i}" for i in range(60)]
    queue, start = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_writer, args=(tmp_path, ids, queue, start)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    computed = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    raw = lines(tmp_path / "samples.jsonl")
    got = [json.loads(x)["id"] for x in raw]                  # every line parses: nothing interleaved
    assert sorted(got) == sorted(ids)                         # each id exactly once
    assert sorted(i for c in computed for i in c) == sorted(ids)   # and computed once: claims split the work
    assert not (tmp_path / "claims.jsonl").exists() and not list((tmp_path / "writers").iterdir())


def _claim_and_hang(directory, ready):
    store = RowStore(directory)
    store.open()
    store.claim("s0")
    ready.set()
    signal.pause()


def test_a_killed_writers_claims_free_themselves(tmp_path):
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_claim_and_hang, args=(tmp_path, ready))
    p.start()
    assert ready.wait(30)
    other = RowStore(tmp_path)
    other.open()
    assert not other.claim("s0")                # the live writer is computing it
    assert other.pending_elsewhere() == ["s0"]
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert other.claim("s0")                    # its lock died with it
    assert other.pending_elsewhere() == []
    other.close()


@pytest.mark.parametrize("garbage", [b"\n\n", b"[1, 2]\n", b'{"no_id": 1}\n'])
def test_lines_without_a_row_are_never_rows(tmp_path, garbage):
    (tmp_path / "samples.jsonl").write_bytes(json.dumps(row(0)).encode() + b"\n" + garbage)
    assert [r["id"] for r in read_rows(tmp_path / "samples.jsonl")] == ["s0"]
    store = RowStore(tmp_path)
    store.open()
    assert store.done == {"s0"}
    store.close()
    assert [json.loads(x)["id"] for x in lines(tmp_path / "samples.jsonl")] == ["s0"]
