"""The no-data table of a data-bound item (Impl.data) that has no rows.

Some items read data sets the harness cannot generate (LongBench, InfiniteBench's books, Booksum,
MMLU) and these machines cannot download (no hub access). They run wherever `task.data_dir` points;
here, with no rows for any cell, they render the table a normal render would write, from the same
renderer and to the same files, with every cell of ours empty (`—`, n = 0) beside the paper's numbers,
plus one line saying which data is missing and how to point a run at it. The item's own renderer is
used so the no-data table has the normal layout, and the line is added to its markdown afterwards so
no renderer needs a special case.

Only data-bound items get this: for any other item no rows means runs not done, and render keeps
failing (MissingResults) so an empty table never stands in for missing work.
"""
from __future__ import annotations

from pathlib import Path

from analysis.catalogue import Dataset, Impl, Item


# --- the data sets (what tasks/*.py read from the hub or task.data_dir) -----------------------------
def longbench(subsets) -> Dataset:
    return Dataset("LongBench", tuple(subsets), "the hub's THUDM/LongBench data.zip", "task.data_dir=<dir>",
                   "<dir>/<subset>.jsonl, LongBench's rows")


def infinitebench(tasks, profile: str | None = None) -> Dataset:
    return Dataset("InfiniteBench", tuple(tasks), "the hub's xinrongzhang2022/InfiniteBench <task>.jsonl",
                   "task.data_dir=<dir>", "<dir>/<task>.jsonl", profile)


BOOKSUM = Dataset("Booksum", ("book level, the reference's test split",),
                  "the hub's togethercomputer/Long-Data-Collections fine-tune/booksum.jsonl.zst",
                  "task.data_dir=<dir>", "one .jsonl of the split in <dir>, or the .jsonl itself")
MMLU = Dataset("MMLU", ("57 subjects, dev and test",), "the hub's cais/mmlu", "task.data_dir=<dir>",
               "MMLU's release layout: <dir>/dev/<subject>_dev.csv, <dir>/test/<subject>_test.csv")


def applies(impl: Impl, overrides: list[str], profile: str | None = None) -> bool:
    """Whether no rows means "no data here": the item is data-bound in this profile (a data set of another
    profile only, e.g. lychee.table3's LongBench for `paper` beside an embedded profile on generated data,
    does not count) and the command gave no data (with task.data_dir given, no rows means runs not done
    yet: render fails as for any other item)."""
    bound = any(d.profile in (None, profile) for d in impl.data) if profile else bool(impl.data)
    return bound and not any(o.lstrip("+").startswith("task.data_dir=") for o in overrides)


def line(item: Item, profile: str) -> str:
    """One line: which data is missing and the command that runs the item where it is."""
    impl = item.require()
    sets = "; ".join(f"{d.name} {', '.join(d.parts)} ({d.source})" for d in impl.data)
    runs = []
    for prof in dict.fromkeys(d.profile or profile for d in impl.data):
        ds = [d for d in impl.data if (d.profile or profile) == prof]
        flag = "" if prof == "embedded" else f" --profile {prof}"
        over = " ".join(dict.fromkeys(d.override for d in ds))
        runs.append(f"`python -m analysis make {item.key}{flag} -- {over}` ({'; '.join(d.layout for d in ds)})")
    text = (f"no data here: {sets} is not on this machine (no rows for any cell). Where it is, run "
            f"{' and '.join(runs)}.")
    return text + (f" {impl.data_note}" if impl.data_note else "")


def render(item: Item, impl: Impl, df, profile: str, out: Path) -> list[Path]:
    """The item's own render of a frame without rows, with the no-data line under the title."""
    paths = impl.render(item, impl, df, profile, out)
    for md in (p for p in paths if p.name == f"{item.key}.md"):
        text = md.read_text()
        if text.startswith("#"):
            title, _, rest = text.partition("\n")
            md.write_text(f"{title}\n\n{line(item, profile)}\n{rest}")
        else:
            md.write_text(f"{line(item, profile)}\n\n{text}")
    return paths
