"""The rows of one run directory on disk, safe against kills and against several writers.

Files (beside config.yaml and summary.json):
  samples.jsonl   one JSON line per finished sample (status "ok"), one line per id: what readers see
  failed.jsonl    one line per sample that raised (status "failed", error), until a rerun succeeds
  .lock           flock'ed around every read-modify-write of the files below (milliseconds each)
  claims.jsonl    "writer W computes sample X" lines, so that two processes on one directory (a
                  duplicate Slurm task, a user rerunning while a run is going) split the samples
                  between them instead of both computing every one
  writers/<W>     each writer holds an flock on its own file while it lives. A claim counts only while
                  its writer's file is locked; the kernel drops the lock when the process dies (SIGKILL
                  too), so a killed writer's claims free themselves and nothing is ever stale.

Kill safety: a row is one os.write of a whole line, then fsync. A kill mid-write leaves a torn last
line: the next writer, under the lock, cuts it off (keeping the bytes in samples.torn) and its sample
is computed again; the rows before it stay byte for byte. A line that does not parse in the middle
of the file (a disk or an editor accident) is moved to samples.corrupt with a warning and its sample
is computed again; a second line for an id already present goes to samples.duplicate. Nothing is
dropped silently.

NFS: Linux maps flock to POSIX byte-range locks on NFS, which work across hosts (lockd on NFSv3,
natively on NFSv4). On a mount without locking (`-o nolock`) every flock succeeds: two writers then
compute the same samples and their appends may interleave (O_APPEND is not atomic on NFS). Readers
still see one row per id (the first), and a torn or corrupt line is repaired as above, but do not run
two writers on one directory there.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def dumps(row: dict) -> bytes:
    return (json.dumps(row, default=_json_default) + "\n").encode()


def _parse(line: bytes) -> dict | None:
    """A row, or None for a line that is not a JSON object with a string id."""
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return row if isinstance(row, dict) and isinstance(row.get("id"), str) else None


def read_rows(path: Path) -> list[dict]:
    """The rows of a samples.jsonl, one per id (the first), in file order. The one reader: the run
    loop and analysis both use it. Tolerant without a lock: a torn last line (a writer killed, or
    one still writing) and lines that do not parse are skipped, never fatal."""
    path = Path(path)
    if not path.exists():
        return []
    out, seen = [], set()
    with open(path, "rb") as f:
        for line in f:
            row = _parse(line) if line.endswith(b"\n") and line.strip() else None
            if row is not None and row["id"] not in seen:
                seen.add(row["id"])
                out.append(row)
    return out


def read_failures(path: Path, done: set[str]) -> list[dict]:
    """failed.jsonl rows of samples not finished since: the last failure per id, in file order."""
    last: dict[str, dict] = {}
    for row in _read_all(Path(path)):
        if row["id"] not in done:
            last.pop(row["id"], None)
            last[row["id"]] = row
    return list(last.values())


def _read_all(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, "rb") as f:
        return [r for line in f if line.endswith(b"\n") and (r := _parse(line)) is not None]


def _append(path: Path, data: bytes, sync: bool = True) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


class RowStore:
    """A writer's handle on a run directory: open(), then claim / append / fail, then close()."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.samples = self.dir / "samples.jsonl"
        self.failed = self.dir / "failed.jsonl"
        self.claims = self.dir / "claims.jsonl"
        self.writers = self.dir / "writers"
        # host, pid and a nonce: unique across hosts and across two stores in one process
        self.writer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.done: set[str] = set()
        self._pos = (None, 0)               # (inode, bytes of samples.jsonl already read)
        self._claims: dict[str, str] = {}
        self._claims_pos = (None, 0)
        self._lock_fd: int | None = None
        self._writer_fd: int | None = None

    # --- life cycle ------------------------------------------------------------------------------
    def open(self) -> None:
        self.writers.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        with self._locked():
            # Created and locked under .lock: a checker (also under .lock) never sees it unlocked.
            self._writer_fd = os.open(self.writers / self.writer, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._writer_fd, fcntl.LOCK_EX)
            self._scan()

    def close(self) -> None:
        """Stop writing. The last writer out compacts: claims gone, failed.jsonl without the ids
        finished since."""
        if self._lock_fd is None:
            return
        with self._locked():
            self._refresh()
            if not self.other_writers():
                self.claims.unlink(missing_ok=True)
                left = read_failures(self.failed, self.done)
                if left:
                    tmp = self.failed.with_name(self.failed.name + ".tmp")
                    tmp.write_bytes(b"".join(dumps(r) for r in left))
                    os.replace(tmp, self.failed)
                else:
                    self.failed.unlink(missing_ok=True)
            (self.writers / self.writer).unlink(missing_ok=True)
            os.close(self._writer_fd)
        os.close(self._lock_fd)
        self._lock_fd = self._writer_fd = None

    @contextmanager
    def _locked(self):
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    # --- writing ---------------------------------------------------------------------------------
    def claim(self, sample_id: str) -> bool:
        """True when this writer should compute the sample: not finished, and not being computed by
        another live writer. The claim is recorded for the others."""
        with self._locked():
            self._refresh()
            if sample_id in self.done:
                return False
            self._refresh_claims()
            owner = self._claims.get(sample_id)
            if owner is not None and owner != self.writer and self._alive(owner):
                return False
            # not fsync'ed: a claim lost in a crash is a claim of a dead writer, void anyway
            _append(self.claims, dumps({"id": sample_id, "writer": self.writer}), sync=False)
            self._claims[sample_id] = self.writer
            return True

    def append(self, row: dict) -> bool:
        """Write a finished sample's row; False (nothing written) when another writer wrote it first."""
        data = dumps(row)
        with self._locked():
            self._refresh()
            if row["id"] in self.done:
                return False
            _append(self.samples, data)
            self.done.add(row["id"])
            st = os.stat(self.samples)
            self._pos = (st.st_ino, st.st_size)
            return True

    def fail(self, row: dict) -> None:
        with self._locked():
            if self.failed.exists() and self.failed.stat().st_size:
                with open(self.failed, "rb") as f:   # a torn last line stays its own (skipped) line
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        _append(self.failed, b"\n")
            _append(self.failed, dumps(row))

    # --- other writers ---------------------------------------------------------------------------
    def other_writers(self) -> list[str]:
        return [p.name for p in self.writers.glob("*") if p.name != self.writer and self._alive(p.name)]

    def pending_elsewhere(self) -> list[str]:
        """Unfinished samples claimed by other live writers."""
        with self._locked():
            self._refresh()
            self._refresh_claims()
            alive = {w: self._alive(w) for w in set(self._claims.values()) if w != self.writer}
            return [i for i, w in self._claims.items() if i not in self.done and alive.get(w)]

    def _alive(self, writer: str) -> bool:
        path = self.writers / writer
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)              # drops our probe lock, if we got it
        path.unlink(missing_ok=True)  # a dead writer's file (we hold .lock: it cannot come back)
        return False

    # --- reading and repair (under the lock) -----------------------------------------------------
    def _refresh(self) -> None:
        """Take in rows other writers appended since we last looked; repair on anything odd."""
        try:
            st = os.stat(self.samples)
        except FileNotFoundError:
            self.done, self._pos = set(), (None, 0)
            return
        ino, pos = self._pos
        if st.st_ino != ino or st.st_size < pos:   # replaced by another writer's repair
            return self._scan()
        if st.st_size == pos:
            return
        with open(self.samples, "rb") as f:
            f.seek(pos)
            new = f.read()
        if not new.endswith(b"\n"):                # a writer died mid-write (we hold the lock)
            return self._scan()
        rows = [_parse(line) for line in new.splitlines(keepends=True)]
        if any(r is None or r["id"] in self.done for r in rows):
            return self._scan()
        self.done.update(r["id"] for r in rows)
        self._pos = (st.st_ino, st.st_size)

    def _scan(self) -> None:
        """Read samples.jsonl whole; cut a torn last line, move corrupt and duplicate lines aside."""
        self.done = set()
        if not self.samples.exists():
            self._pos = (None, 0)
            return
        raw = self.samples.read_bytes()
        lines = raw.splitlines(keepends=True)
        torn = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
        keep, corrupt, duplicate, blank = [], [], [], 0
        for n, line in enumerate(lines, 1):
            row = _parse(line) if line.strip() else None
            if not line.strip():
                blank += 1                         # no data in it: dropped without a word
            elif row is None:
                corrupt.append((n, line))
            elif row["id"] in self.done:
                duplicate.append((n, line))
            else:
                self.done.add(row["id"])
                keep.append(line)
        if torn:
            _append(self.dir / "samples.torn", torn + b"\n")
            warn(f"{self.samples}: cut a torn last line ({len(torn)} bytes: a write interrupted by a kill), "
                 f"kept in samples.torn; its sample runs again")
        for bad, name, what in ((corrupt, "samples.corrupt", "line(s) that do not parse"),
                                (duplicate, "samples.duplicate", "second row(s) for an id")):
            if bad:
                _append(self.dir / name, b"".join(line for _, line in bad))
                numbers = ", ".join(str(n) for n, _ in bad[:10]) + (" ..." if len(bad) > 10 else "")
                warn(f"{self.samples}: moved {len(bad)} {what} (line {numbers}) to {name}"
                     + ("; their samples run again" if bad is corrupt else ""))
        if corrupt or duplicate or blank:
            tmp = self.samples.with_name(self.samples.name + ".tmp")
            tmp.write_bytes(b"".join(keep))
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, self.samples)
        elif torn:
            os.truncate(self.samples, len(raw) - len(torn))
        st = os.stat(self.samples)
        self._pos = (st.st_ino, st.st_size)

    def _refresh_claims(self) -> None:
        try:
            st = os.stat(self.claims)
        except FileNotFoundError:
            self._claims, self._claims_pos = {}, (None, 0)
            return
        ino, pos = self._claims_pos
        if st.st_ino != ino or st.st_size < pos:
            self._claims, pos = {}, 0
        with open(self.claims, "rb") as f:
            f.seek(pos)
            new = f.read()
        complete = new[: new.rfind(b"\n") + 1]     # a torn claim (its writer died) is not a claim
        for line in complete.splitlines():
            try:
                c = json.loads(line)
                self._claims[c["id"]] = c["writer"]
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
                continue
        self._claims_pos = (st.st_ino, pos + len(complete))
