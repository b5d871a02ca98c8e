"""Paths of the data the repository ships in data/ (data/README.md) that the embedded profiles read
offline, relative to the repository root (tasks/datafiles.py resolves them from there, and reads the
xz-compressed copies). One place, so every paper module points at the same copy; the paper profiles
leave these keys unset and read the hub."""
from __future__ import annotations

from typing import Any

PG19_DATA = "data/pg19_books/pg19_books.jsonl"   # the 4 PG-19 test books (57K-77K tokens each) + 1 long book
MATH500_DATA = "data/math500"                     # MATH-500's test.jsonl (lychee.table2 embedded: level 1)
# RULER's essay haystack (essay tasks: niah_single_2/3, niah_multikey_1, ...) and nltk's untrained punkt
# (no punkt_tab data offline): without them an essay task loads from the hub and fails offline
EMBEDDED_RULER = ("task.essay_path=data/paul_graham_essays/ruler/PaulGrahamEssays.json",
                  "task.sentence_splitter=punkt_untrained")

# Runs recorded before data/ existed read the same files from a copy beside the repository and name them
# ../shared/data/<path>; data/<path> holds the same bytes (data/SHA256SUMS), so a cell that says data/X is
# filled by such a run (analysis.runs.same): the committed rows keep their recorded configs and run ids.
LEGACY_PREFIX = "../shared/data/"


def canonical_data_path(value: Any) -> Any:
    """`data/X` for a recorded `../shared/data/X`; any other value unchanged."""
    if isinstance(value, str) and value.startswith(LEGACY_PREFIX):
        return "data/" + value[len(LEGACY_PREFIX):]
    return value
