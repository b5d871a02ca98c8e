"""`analysis run --jobs N`: the cells to do dealt into N shards, and the launcher keeping N processes
busy (never more), each with its share of the host's threads."""
from __future__ import annotations

import sys

from analysis.launch import launch, shards
from analysis.runs import Cell


def _cells(n):
    return [Cell(overrides=[f"x={i}"], values={"x": i}, block="", row="", col=i) for i in range(n)]


def test_shards_deal_every_cell_once_round_robin():
    cells = _cells(7)
    got = shards(cells, 3)
    assert [[c.values["x"] for c in g] for g in got] == [[0, 3, 6], [1, 4], [2, 5]]
    assert shards(cells[:2], 4) == [[cells[0]], [cells[1]]]          # no empty shard
    assert shards(cells, 1) == [cells]


def test_launch_runs_at_most_jobs_at_once_and_counts_failures(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    log = tmp_path / "events"
    body = ("import os, sys, time; f = open(sys.argv[1], 'a'); f.write('start ' + os.environ['OMP_NUM_THREADS'] + '\\n');"
            " f.flush(); time.sleep(0.6); f.write('end\\n'); f.close(); sys.exit(int(sys.argv[2]))")
    cmds = [[sys.executable, "-c", body, str(log), str(int(i == 3))] for i in range(5)]
    assert launch(cmds, jobs=2) == 1                                  # the one that exits 1
    running, most = 0, 0
    for line in log.read_text().splitlines():
        running += 1 if line.startswith("start") else -1
        most = max(most, running)
    assert most == 2 and running == 0
    assert all(line.split()[1] != "0" for line in log.read_text().splitlines() if line.startswith("start"))


def test_launch_spreads_processes_over_the_visible_gpus(tmp_path, monkeypatch):
    """On a machine of several GPUs each process gets the one running the fewest: without it every
    process takes GPU 0 and a 4-GPU sweep runs at a quarter of its speed."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    log = tmp_path / "events"
    body = ("import os, sys, time; f = open(sys.argv[1], 'a'); f.write(sys.argv[3] + ' ' + os.environ['CUDA_VISIBLE_DEVICES']"
            " + '\\n'); f.close(); time.sleep(float(sys.argv[2]))")
    # 3 at once: 2, 5, 2; the short one on 5 ends first, so the 4th goes to 5, not to 2 again
    cmds = [[sys.executable, "-c", body, str(log), s, str(i)] for i, s in enumerate(("1.5", "0.1", "1.5", "0.1"))]
    assert launch(cmds, jobs=3) == 0
    got = dict(line.split() for line in log.read_text().splitlines())      # processes write in any order
    assert [got[str(i)] for i in range(4)] == ["2", "5", "2", "5"]


def test_launch_leaves_a_single_gpu_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    log = tmp_path / "events"
    body = "import os, sys; open(sys.argv[1], 'a').write(os.environ['CUDA_VISIBLE_DEVICES'] + '\\n')"
    assert launch([[sys.executable, "-c", body, str(log)]] * 2, jobs=2) == 0
    assert log.read_text().split() == ["3", "3"]
