"""A pure move of measured code keeps a benchmark file fresh; an edit makes it stale
(analysis/provenance.py `staleness`, analysis/renames.py), on a temporary git repository."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from analysis import provenance
from analysis.renames import Renames, canonical

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

KERNEL = '''"""The kernel (used by pkg/method.py)."""
from ._common import backend


def kern(x):
    return backend(x) + 1
'''
METHOD = '''"""A method over kernels/kern.py."""
import os

from kernels import kern as K
from kernels.kern import kern
from pkg import helper, other


def run(x):
    return K.kern(x) + kern(x) + helper.h() + other.o() + len(os.sep)
'''


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _write(repo, files):
    for name, text in files.items():
        p = repo / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@t")
    _git(tmp_path, "config", "user.name", "t")
    _write(tmp_path, {"kernels/__init__.py": "", "kernels/_common.py": "def backend(x):\n    return x\n",
                      "kernels/kern.py": KERNEL, "pkg/__init__.py": "", "pkg/method.py": METHOD,
                      "pkg/helper.py": "def h():\n    return 1\n", "pkg/other.py": "def o():\n    return 2\n",
                      "README.md": "kernels/kern.py\n"})
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "first")
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    provenance._edited.cache_clear()
    return tmp_path


def _commit(repo, msg):
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", msg)
    provenance._edited.cache_clear()


def _moved(repo):
    """kernels/kern.py -> kernels/block_kern.py, pkg/helper.py -> pkg/parts/helper.py, their importers
    updated as a developer would (an import split in two, then sorted by the import sorter)."""
    _git(repo, "mv", "kernels/kern.py", "kernels/block_kern.py")
    (repo / "pkg" / "parts").mkdir()
    _git(repo, "mv", "pkg/helper.py", "pkg/parts/helper.py")
    _write(repo, {"pkg/parts/__init__.py": "",
                  "kernels/block_kern.py": KERNEL.replace("pkg/method.py", "pkg/method.py"),
                  "pkg/method.py": METHOD.replace("kernels/kern.py", "kernels/block_kern.py")
                  .replace("from kernels import kern as K\nfrom kernels.kern import kern\nfrom pkg import helper, other\n",
                           "from kernels import block_kern as K\nfrom kernels.block_kern import kern\nfrom pkg import other\n"
                           "from pkg.parts import helper\n"),
                  "README.md": "kernels/block_kern.py\n"})


def test_a_pure_move_keeps_the_file_fresh(repo):
    first = _git(repo, "rev-parse", "HEAD")
    _moved(repo)
    _commit(repo, "move")
    measures = ("kernels/block_kern.py", "kernels/_common.py", "pkg/method.py", "pkg/parts")
    assert provenance.staleness(first, measures) is None
    assert provenance.staleness(first, ("kernels", "pkg")) is None       # folders: the new __init__ is empty


def test_an_edit_after_or_with_the_move_makes_it_stale(repo):
    first = _git(repo, "rev-parse", "HEAD")
    _moved(repo)
    (repo / "kernels" / "block_kern.py").write_text(KERNEL.replace("+ 1", "+ 2"))
    _commit(repo, "move and edit")
    assert provenance.staleness(first, ("kernels/block_kern.py",)).startswith("stale:")
    assert provenance.staleness(first, ("pkg/method.py",)) is None        # only the kernel changed
    (repo / "pkg" / "method.py").write_text((repo / "pkg" / "method.py").read_text().replace("import os\n", ""))
    _commit(repo, "drop an import")
    assert provenance.staleness(first, ("pkg/method.py",)).startswith("stale:")


def test_a_new_file_under_a_measured_folder_is_an_edit(repo):
    first = _git(repo, "rev-parse", "HEAD")
    _write(repo, {"pkg/new.py": "X = 1\n"})
    _commit(repo, "add")
    assert provenance.staleness(first, ("pkg",)).startswith("stale:")
    assert provenance.staleness(first, ("kernels",)) is None


def test_rewrite_names_the_moved_modules_only():
    r = Renames({"kernels/kern.py": "kernels/block_kern.py", "pkg/helper.py": "pkg/parts/helper.py",
                 "runners/train.py": "offline/train.py"})
    text = ("from .kern import kern\nfrom kernels import kern\nfrom pkg import helper, other\n"
            "x = 'python -m runners.train; kernels/kern.py; kernels/kern.kern; kernels/kern_triton.py'\n"
            "from kernels.kern_triton import y\n")
    assert r.rewrite(text, "kernels/other.py") == (
        "from .block_kern import kern\nfrom kernels import block_kern as kern\nfrom pkg.parts import helper\n"
        "from pkg import other\n"
        "x = 'python -m offline.train; kernels/block_kern.py; kernels/block_kern.kern; kernels/kern_triton.py'\n"
        "from kernels.kern_triton import y\n")
    here = 'D = Path(__file__).resolve().parent / "data"\nR = Path(__file__).parents[1]\n'
    assert r.rewrite(here, "pkg/helper.py") == ('D = Path(__file__).resolve().parents[1] / "data"\n'
                                               'R = Path(__file__).parents[2]\n')    # the same folders
    assert r.rewrite(here, "runners/train.py") == 'D = Path(__file__).resolve().parent / "data"\nR = Path(__file__).parents[1]\n'
    assert canonical("import b\n\nimport a\nx = 1\n", "f.py") == canonical("import a\nimport b\nx = 1\n", "f.py")
    assert canonical("import a\nx = 1\nimport b\n", "f.py") != canonical("import a\nimport b\nx = 1\n", "f.py")
    doc = '"""Doc."""\nimport a  # why\n\n\ndef f(x):\n    """Doc."""\n    return (x +\n            1)\n'
    assert canonical(doc, "f.py") == canonical("import a\ndef f(x):\n    return x + 1\n", "f.py")
    assert canonical(doc, "f.py") != canonical("import a\ndef f(x):\n    return x + 2\n", "f.py")
    assert canonical("# a\n", "f.yaml") != canonical("# b\n", "f.yaml")   # other files: their text


# --- definitions moved out of a measured file, behind an import (analysis/renames.py `moved_out`) ---------
CONFIG = '''"""Options."""
import textwrap

from kernels._common import backend

WIDTH = 110


def _plain(cfg):
    return dict(cfg)


def wrap(text):
    return textwrap.wrap(text, WIDTH)


def parse(cfg):
    return backend(_plain(cfg))
'''
SHARED = '''"""Shared options."""
import textwrap

WIDTH = 110


def plain(cfg):
    """Moved here."""
    return dict(cfg)


def wrap(text):
    return textwrap.wrap(text, WIDTH)


def unrelated():
    return 3
'''
SPLIT = '''"""Options, on common/shared.py."""
from common.shared import plain as _plain
from common.shared import wrap
from kernels._common import backend


def parse(cfg):
    return backend(_plain(cfg))
'''


def _split(repo, shared=SHARED, config=SPLIT):
    _write(repo, {"common/__init__.py": "", "common/shared.py": shared, "pkg/config.py": config})
    _commit(repo, "split")


def test_definitions_moved_out_behind_an_import_keep_the_file_fresh(repo):
    _write(repo, {"pkg/config.py": CONFIG})
    _commit(repo, "config")
    first = _git(repo, "rev-parse", "HEAD")
    _split(repo)                              # WIDTH, _plain (imported under its old name), wrap moved out
    assert provenance.staleness(first, ("pkg/config.py",)) is None
    assert provenance.staleness(first, ("pkg",)) is None


def test_a_moved_definition_that_changed_is_an_edit(repo):
    _write(repo, {"pkg/config.py": CONFIG})
    _commit(repo, "config")
    first = _git(repo, "rev-parse", "HEAD")
    _split(repo, shared=SHARED.replace("return dict(cfg)", "return dict(cfg or {})"))
    assert provenance.staleness(first, ("pkg/config.py",)).startswith("stale:")


def test_what_a_moved_definition_names_must_mean_the_same_there(repo):
    _write(repo, {"pkg/config.py": CONFIG})
    _commit(repo, "config")
    first = _git(repo, "rev-parse", "HEAD")
    _split(repo, shared=SHARED.replace("WIDTH = 110", "WIDTH = 80"))   # wrap's code equal, its WIDTH not
    assert provenance.staleness(first, ("pkg/config.py",)).startswith("stale:")


NO_WRAP = SHARED.replace("\n\ndef wrap(text):\n    return textwrap.wrap(text, WIDTH)\n", "")


@pytest.mark.parametrize("config, shared", [
    (SPLIT.replace("backend(_plain(cfg))", "backend(_plain(cfg)) + 0"), SHARED),   # a kept definition edited
    (SPLIT + "\n\ndef extra():\n    return 1\n", SHARED),                          # new code
    (SPLIT.replace("from common.shared import wrap\n", ""), NO_WRAP),             # wrap deleted, not moved
    (SPLIT.replace("import plain as _plain", "import unrelated as _plain"), SHARED),  # another definition
    (SPLIT.replace("from kernels._common import backend\n", ""), SHARED),         # an import still named
    (SPLIT + "\nprint(1)\n", SHARED),                                              # a new statement
])
def test_anything_but_a_pure_split_is_an_edit(repo, config, shared):
    _write(repo, {"pkg/config.py": CONFIG})
    _commit(repo, "config")
    first = _git(repo, "rev-parse", "HEAD")
    _split(repo, shared=shared, config=config)
    assert provenance.staleness(first, ("pkg/config.py",)).startswith("stale:")


def test_a_new_home_of_moved_code_may_be_declared_measured(repo):
    """Declaring the new file keeps later edits there visible; the split itself stays a move as long
    as that file holds only the moved definitions (and imports)."""
    _write(repo, {"pkg/config.py": CONFIG})
    _commit(repo, "config")
    first = _git(repo, "rev-parse", "HEAD")
    only = SHARED.replace("\n\ndef unrelated():\n    return 3\n", "")
    _split(repo, shared=only)
    measures = ("pkg/config.py", "common/shared.py")
    assert provenance.staleness(first, measures) is None
    second = _git(repo, "rev-parse", "HEAD")
    _write(repo, {"common/shared.py": only.replace("return dict(cfg)", "return dict(cfg or {})")})
    _commit(repo, "edit the new home")
    assert provenance.staleness(first, measures).startswith("stale:")
    assert provenance.staleness(second, measures).startswith("stale:")
    _write(repo, {"common/shared.py": SHARED})       # more than the moved code in a declared new file
    _commit(repo, "more")
    assert provenance.staleness(first, measures).startswith("stale:")
