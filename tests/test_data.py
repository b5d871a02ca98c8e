"""The data the repository ships (data/, data/README.md): every file decompresses to its recorded
sha256, every folder says where its files come from, every data path an embedded profile or a config
names is shipped, nothing reads a copy outside the repository, and rows recorded when the files lived
beside it still fill the cells that now name data/."""
from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tasks import datafiles

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"


def _sums() -> dict[str, str]:
    lines = (DATA / "SHA256SUMS").read_text().splitlines()
    return {name: digest for digest, name in (line.split("  ", 1) for line in lines if line.strip())}


def test_every_shipped_file_decompresses_to_its_recorded_sha256():
    sums = _sums()
    stored = sorted(str(p.relative_to(DATA))[: -len(".xz")] for p in DATA.rglob("*.xz"))
    assert stored == sorted(sums), "data/SHA256SUMS and the .xz files differ"
    for name, digest in sums.items():
        with lzma.open(DATA / f"{name}.xz") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, name
    # the unchanged copies are the upstream files (sha256 as their PROVENANCE.md source states)
    assert sums["math500/test.jsonl"].startswith("35dc41080a36")
    assert sums["paul_graham_essays/ruler/PaulGrahamEssays.json"].startswith("1af094ff36d4")


def test_every_set_names_its_source_and_licence():
    readme = (DATA / "README.md").read_text()
    for folder in sorted({Path(n).parts[0] for n in _sums()}):
        prov = (DATA / folder / "PROVENANCE.md").read_text()
        assert re.search(r"`[0-9a-f]{40}`", prov), folder                     # source pinned to a commit
        assert re.search(r"licen[cs]e", prov, re.IGNORECASE) and f"`{folder}/" in readme, folder
        for lic in re.findall(r"\.\./licenses/([\w.-]+)", prov):
            assert (DATA / "licenses" / lic).is_file(), lic
    assert (DATA / "licenses" / "MIT.txt").is_file() and (DATA / "licenses" / "Apache-2.0.txt").is_file()


def test_pg19_rows_are_the_documented_books():
    with datafiles.open_text(DATA / "pg19_books" / "pg19_books.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [(r["book_id"], r["pg19_split"] == "test") for r in rows] == [
        ("10146", True), ("10321", True), ("10356", True), ("10762", True), ("10905", False)]
    assert [len(r["text"]) for r in rows] == [249426, 318135, 309378, 341925, 1009102]


def test_datafiles_reads_plain_xz_and_gz_alike(tmp_path, monkeypatch):
    text = "line one\nzwei – drei\n"
    (tmp_path / "a.jsonl").write_text(text, encoding="utf-8")
    with lzma.open(tmp_path / "b.jsonl.xz", "wt", encoding="utf-8") as f:
        f.write(text)
    with gzip.open(tmp_path / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(text)
    for name in ("a.jsonl", "b.jsonl", "c.jsonl", "b.jsonl.xz"):
        assert datafiles.is_file(tmp_path / name) and datafiles.read_text(tmp_path / name) == text, name
    assert datafiles.plain_name(tmp_path / "b.jsonl.xz") == "b.jsonl"
    (tmp_path / "b.jsonl").write_text("plain wins\n", encoding="utf-8")          # a decompressed copy is read first
    assert datafiles.read_text(tmp_path / "b.jsonl") == "plain wins\n"
    assert not datafiles.is_file(tmp_path / "none.jsonl")
    with pytest.raises(FileNotFoundError):
        datafiles.read_text(tmp_path / "none.jsonl")
    monkeypatch.chdir(tmp_path)                                                # data/... from any directory
    assert datafiles.resolve("data/math500") == DATA / "math500"
    assert datafiles.is_file("data/math500/test.jsonl")


def _embedded_data_values() -> list[tuple[str, str, str]]:
    """(item, key, value) of every override of an item's embedded cells that names a file under data/."""
    import analysis.papers  # noqa: F401  (registers the implementations)
    from analysis import catalogue
    from analysis.runs import expand

    out = []
    for key in catalogue.implemented_keys():
        impl = catalogue.get(key).impl
        for cell in expand(impl.sweeps.get("embedded", []), [], impl.label):
            out += [(key, k, v) for k, v in cell.values.items() if isinstance(v, str) and v.startswith("data/")]
    return out


def test_every_data_path_the_embedded_profiles_and_configs_name_is_shipped():
    named = _embedded_data_values()
    assert {k for _, k, _ in named} >= {"task.data_dir", "task.essay_path"}    # PG-19, MATH-500, RULER essays
    for item, k, v in named:
        p = datafiles.resolve(v)
        assert p.is_dir() or datafiles.is_file(p), f"{item}: {k}={v} is not in data/"
        assert p.resolve().is_relative_to(DATA), f"{item}: {k}={v} is outside data/"
    for conf, key in (("train_heads.yaml", "data.books"), ("minference_search.yaml", "sample.books")):
        v = OmegaConf.select(OmegaConf.load(ROOT / "conf" / conf), key)
        assert v.startswith("data/") and datafiles.is_file(v), (conf, v)


def test_nothing_reads_a_copy_outside_the_repository():
    legacy = "../" + "shared/data"
    allowed = {"analysis/shared_data.py", "tests/test_data.py"}   # the alias that matches older runs, its test
    found = []
    for dirpath, dirnames, files in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in ("results", "notes", "data")]
        for name in files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(ROOT))
            code = p.suffix in (".py", ".yaml", ".sh", ".mk", ".toml") or name == "Makefile"
            if code and rel not in allowed and legacy in p.read_text(encoding="utf-8", errors="replace"):
                found.append(rel)
    assert not found, f"{found} name {legacy}: the repository ships its data in data/"


def test_rows_recorded_with_the_old_location_fill_the_cells_that_name_data():
    """lychee.table2's embedded runs were recorded with task.data_dir=../shared/data/math500 (the same
    file, outside the repository); its cells now say data/math500 and are still filled by them."""
    import analysis.papers  # noqa: F401
    from analysis import catalogue, compact
    from analysis.runs import expand, matches, same

    assert same("../shared/data/math500", "data/math500") and not same("../other/math500", "data/math500")
    impl = catalogue.get("lychee.table2").impl
    cells = [c for c in expand(impl.sweeps["embedded"], [], impl.label) if c.values.get("task") == "math500"]
    assert cells and all(c.values["task.data_dir"] == "data/math500" for c in cells)
    heads = [compact.read_head(p) for p in sorted((ROOT / "results/rows/math500").rglob("*.jsonl"))]
    assert heads and all(h["config"]["task"]["data_dir"] == "../shared/data/math500" for h in heads)
    for c in cells:
        assert sum(matches(h["config"], c.values) for h in heads) == 1, c.values
