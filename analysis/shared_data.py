"""Paths of the small real datasets beside the project (../shared/data, relative to the repository
root, where run.py resolves them) that embedded profiles read offline. One place, so every paper
module points at the same copy; on a GPU machine stage the files at the same relative paths."""
PG19_DATA = "../shared/data/pg19_books/pg19_books.jsonl"   # 4 test books, 57K-77K tokens each
# RULER's essay haystack (essay tasks: niah_single_2/3, niah_multikey_1, ...) and nltk's untrained punkt
# (no punkt_tab data offline): without them an essay task loads from the hub and fails offline
EMBEDDED_RULER = ("task.essay_path=../shared/data/paul_graham_essays/ruler/PaulGrahamEssays.json",
                  "task.sentence_splitter=punkt_untrained")
