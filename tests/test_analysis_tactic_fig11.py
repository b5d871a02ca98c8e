"""Tactic Fig. 11's two stages: Tactic's LongBench runs give each task and target a budget (the mean of
its samples' `method_attended`), the second stage runs Quest and StreamingLLM at exactly that budget,
and the table puts them under the target whose budget they ran at."""
from __future__ import annotations

from analysis_fakes import fake_metrics_run as _fake

from analysis import catalogue
from analysis.__main__ import main
from analysis.runs import expand


def _status(capsys, tmp_path) -> str:
    capsys.readouterr()
    assert main(["status", "tactic.fig11", "--profile", "embedded", "--results", str(tmp_path / "runs"),
                 "--rows", str(tmp_path / "rows")]) == 0
    return capsys.readouterr().out


def test_second_stage_runs_at_tactics_mean_budget(tmp_path, capsys):
    impl = catalogue.get("tactic.fig11").impl
    first = [c for c in expand(impl.sweeps["embedded"], [], impl.label) if c.values["task.subsets"] == "qasper"]
    assert [c.col for c in first] == ["50%", "70%", "90%"]
    assert "method.budget" not in _status(capsys, tmp_path)                  # no Tactic rows: no second stage
    attended = {"50%": [100.0, 103.0], "70%": [300.0, 300.0], "90%": [800.0, 810.0]}
    for c in first:
        _fake(tmp_path / "runs", c.values, [{"score": 0.5, "method_attended": a} for a in attended[c.col]])
    out = _status(capsys, tmp_path)
    for k in (102, 300, 805):                                                 # round(101.5) = 102
        assert f"method=quest method.page_size=8 method.budget={k}" in out
        assert f"method=streaming_llm method.sink=4 method.budget={k}" in out
    second = [line.split(" :: ")[1] for line in out.splitlines() if "method.budget=" in line]
    assert len(second) == 6
    for i, line in enumerate(second):
        values = dict(o.split("=", 1) for o in line.split())
        _fake(tmp_path / "runs", {**values, "method.budget": int(values["method.budget"])},
              [{"score": 0.1 * (i + 1)}] * 2)
    assert "9 done, 15 missing" in _status(capsys, tmp_path)                # qasper: 3 Tactic + 6 baselines
    assert main(["render", "tactic.fig11", "--profile", "embedded", "--results", str(tmp_path / "runs"),
                 "--rows", str(tmp_path / "rows"), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "tables" / "tactic.fig11.md").read_text()
    assert "- qasper, 50%: 102" in md and "- qasper, 90%: 805" in md
    rows = [line for line in md.splitlines() if line.startswith(("| Quest |", "| StreamingLLM |"))]
    assert rows == ["| Quest | 10 [10–10] | 30 [30–30] | 50 [50–50] | 2 |",       # under the target it matched
                    "| StreamingLLM | 20 [20–20] | 40 [40–40] | 60 [60–60] | 2 |"]
    assert (tmp_path / "out" / "figures" / "tactic.fig11.png").exists()


def test_run_launches_the_second_stage_once_the_first_has_rows(tmp_path, monkeypatch):
    import analysis.launch as launch_mod

    impl = catalogue.get("tactic.fig11").impl
    calls = []

    def fake_launch(cmds, dry_run=False, parallel=False, jobs=1):
        calls.append(cmds)
        if len(calls) == 1:                       # the first stage "runs": every Tactic cell gets rows
            for c in expand(impl.sweeps["embedded"], [], impl.label):
                _fake(tmp_path / "runs", c.values, [{"score": 0.5, "method_attended": 64.0}])
        return 0

    monkeypatch.setattr(launch_mod, "launch", fake_launch)
    assert main(["run", "tactic.fig11", "--profile", "embedded", "--results", str(tmp_path / "runs"),
                 "--rows", str(tmp_path / "rows")]) == 0
    assert len(calls) == 2
    assert not any("method.budget=" in " ".join(c) for c in calls[0])
    second = " ".join(" ".join(c) for c in calls[1])
    assert "method=quest" in second and "method.budget=64" in second and "method=tactic" not in second
