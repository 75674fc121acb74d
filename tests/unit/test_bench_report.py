"""``ssdmpi bench report`` and the result files it reads (``ssdmpi/bench/report.py``, ``result.py``).

The committed BENCHMARKS.md must be the render of the committed data (so the page cannot
drift from the runs); the renderer's tables, claims and verdicts are checked on small
hand-made result files whose expected figures are worked out here by hand; every ``ssdmpi
bench`` kind writes the provenance of its results.
"""

import csv
import json
import re

import pytest

from ssdmpi.bench import report
from ssdmpi.bench.result import FORMAT, command_line, dumps, machine, provenance
from ssdmpi.errors import UserError
from tests.conftest import ROOT, run_cli
from tests.unit.test_bench_train import synthetic_bench

# ----------------------------------------------------------------------------- the committed page

def test_the_committed_page_is_the_render_of_the_committed_data():
    rendered = report.render(ROOT / "docs" / "results", ROOT)
    assert (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8") == rendered, \
        "BENCHMARKS.md differs from its data: run 'ssdmpi bench report --out BENCHMARKS.md'"


def test_the_committed_page_links_only_to_files_that_exist():
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(((?:docs|\.\.)[^)#]*)\)", text)
    assert links, "the page links its data files"
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_the_compute_bound_accuracy_gap_is_in_the_summary():
    summary = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").split("## Summary")[1].split("\n## ")[0]
    row = next(line for line in summary.splitlines() if "after 150 steps (LeNet-5)" in line)
    deltas = [next(r["acc_delta"] for r in json.loads((ROOT / f"docs/figures/compute-bound-acc-s{s}/result.json")
                                                       .read_text())["rows"] if r["name"] == "ssd-period-k5")
              for s in (0, 1, 2)]
    mean = sum(deltas) / 3
    assert f"{mean:+.2f} points" in row and ("**met**" if mean >= -1.0 else "**not met**") in row


# ----------------------------------------------------------------------------- the renderer

def result_file(path, rows, **extra):
    """A result file as ``ssdmpi bench`` writes one (fixed provenance, so the page is predictable)."""
    data = {"format": FORMAT, "benchmark": "train", "command": "ssdmpi bench train --net 1gbit --out OUT",
            "date": "2026-01-02T03:04:05Z", "machine": {"cpu": "Test CPU", "cores": 4, "mpi": "MPICH 9"},
            "load_average": [0.5, 0.25, 0.125], "rows": rows, **extra}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(data))
    return path


TEMPLATE = "# Page\n\nIntro.\n\n{{summary}}\n\n{{sections}}\n\n## Machines\n\n{{machines}}\n"
ROWS = [{"name": "ssgd", "speedup": 1.0, "t_s": 0.5, "acc": 80.0, "runs": [1.0, 2.0]},
        {"name": "ssd", "speedup": 2.5, "t_s": 0.2, "acc": None, "runs": [0.5, -3.0]}]


def make_page(tmp_path, claims, tables=None):
    """A results directory with one result file and one entry; returns the results directory."""
    results = tmp_path / "docs" / "results"
    result_file(tmp_path / "docs" / "figures" / "a" / "result.json", ROWS)
    result_file(tmp_path / "docs" / "figures" / "b" / "result.json", [{"name": "ssd", "speedup": 0.5}])
    (results / "page.md").parent.mkdir(parents=True, exist_ok=True)
    (results / "page.md").write_text(TEMPLATE)
    entry = {"title": "Speed: a test", "order": 1, "about": "About it.",
             "results": {"A": "../figures/a/result.json", "B": "../figures/b/result.json"},
             "tables": tables or [], "claims": claims, "notes": ["Note one.", "Note two."]}
    (results / "speed.json").write_text(json.dumps(entry))
    return results


SPEEDUP = {"claim": "ssd over ssgd", "goal": "at least 2x", "test": [">=", 2], "format": "{:.2f}x",
           "values": [{"label": "A", "result": "A", "where": {"name": "ssd"}, "field": "speedup"}]}


def summary_rows(text):
    head = text.split("\n\n## Speed")[0]
    return [line for line in head.splitlines() if line.startswith("| ") and "claim" not in line]


def test_a_claim_row_has_figure_goal_verdict_machine_command_and_data(tmp_path):
    results = make_page(tmp_path, [SPEEDUP])
    text = report.render(results, tmp_path)
    assert summary_rows(text) == [
        "| ssd over ssgd | 2.50x (A) | at least 2x | **met** | Test CPU, 4 cores, MPICH 9 | "
        "[`ssdmpi bench train`](#speed-a-test) | [A](docs/figures/a/result.json) |"]
    assert text.startswith(report.GENERATED + "\n\n# Page\n\nIntro.\n")


def test_verdicts_not_met_and_partly_met(tmp_path):
    one_fails = dict(SPEEDUP, test=[">=", 3])
    partly = dict(SPEEDUP, values=SPEEDUP["values"] + [{"label": "B", "result": "B", "where": {"name": "ssd"},
                                                         "field": "speedup"}])
    text = report.render(make_page(tmp_path, [one_fails, partly]), tmp_path)
    first, second = summary_rows(text)
    assert "| 2.50x (A) | at least 2x | **not met** |" in first
    assert "| 2.50x (A), 0.50x (B) | at least 2x | **not met** (1 of 2) |" in second
    assert "[A](docs/figures/a/result.json), [B](docs/figures/b/result.json)" in second


def test_a_claim_can_show_only_its_worst_value(tmp_path):
    """``"show": "worst"``: the value nearest to failing (the lowest under >=, the highest under
    <=), labelled, with the count; the verdict still weighs every value."""
    both = SPEEDUP["values"] + [{"label": "B", "result": "B", "where": {"name": "ssd"}, "field": "speedup"}]
    at_least = dict(SPEEDUP, values=both, show="worst", test=[">=", 0.4])
    at_most = dict(SPEEDUP, values=both, show="worst", test=["<=", 2])
    first, second = summary_rows(report.render(make_page(tmp_path, [at_least, at_most]), tmp_path))
    assert "| 0.50x (B; the worst of 2) | at least 2x | **met** |" in first
    assert "| 2.50x (A; the worst of 2) | at least 2x | **not met** (1 of 2) |" in second
    with pytest.raises(UserError, match='"show": \'best\''):
        report.render(make_page(tmp_path, [dict(SPEEDUP, show="best")]), tmp_path)


def test_ratio_difference_and_aggregates(tmp_path):
    results = make_page(tmp_path, [])
    entry = report.load_entries(results)[0]
    ssd, ssgd = ({"result": "A", "where": {"name": n}, "field": "t_s"} for n in ("ssd", "ssgd"))
    assert report.claim_value(entry, {"ratio": [ssd, ssgd]}) == pytest.approx(0.2 / 0.5)
    assert report.claim_value(entry, {"difference": [ssd, ssgd]}) == pytest.approx(0.2 - 0.5)
    every = {"result": "A", "where": {"name": ["ssgd", "ssd"]}, "field": "runs"}    # lists: one value per run
    assert report.claim_value(entry, dict(every, agg="min")) == -3.0
    assert report.claim_value(entry, dict(every, agg="max")) == 2.0
    assert report.claim_value(entry, dict(every, agg="maxabs")) == 3.0
    assert report.claim_value(entry, dict(every, agg="mean")) == pytest.approx((1.0 + 2.0 + 0.5 - 3.0) / 4)
    assert report.claim_value(entry, {"mean of": [ssd, ssgd, {"ratio": [ssd, ssgd]}]}) == \
        pytest.approx((0.2 + 0.5 + 0.2 / 0.5) / 3)
    assert report._used_results([{"mean of": [ssd, {"difference": [{"result": "B"}, ssgd]}]}]) == ["A", "B"]
    # path "": the result object itself is the one row (a flat result such as bench engine's --json)
    assert report.claim_value(entry, {"result": "A", "path": "", "field": "load_average", "agg": "max"}) == 0.5
    with pytest.raises(UserError, match='"mean of" needs at least one value'):
        report.claim_value(entry, {"mean of": []})
    with pytest.raises(UserError, match="matches 2 rows"):
        report.claim_value(entry, {"result": "A", "field": "speedup"})
    with pytest.raises(UserError, match="expected numbers"):
        report.claim_value(entry, {"result": "A", "where": {"name": "ssd"}, "field": "acc"})
    with pytest.raises(UserError, match="no result labelled 'C'"):
        report.claim_value(entry, {"result": "C", "field": "speedup"})


def test_a_table_formats_scales_blanks_and_aligns(tmp_path):
    table = {"caption": "Times:", "rows": [{"result": "A", "add": {"run": "first"}}],
             "columns": [["run", "run"], ["name", "variant"], ["t_s", "t ms", "{:.1f}", 1000],
                         ["acc", "acc %", "{:.2f}"], ["runs", "per run", "{:+.1f}"]]}
    text = report.render(make_page(tmp_path, [], [table]), tmp_path)
    section = text.split("## Speed: a test\n\nAbout it.\n\n")[1]
    assert section.startswith("Times:\n\n"
                              "| run | variant | t ms | acc % | per run |\n"
                              "|---|---|---:|---:|---:|\n"
                              "| first | ssgd | 500.0 | 80.00 | +1.0, +2.0 |\n"
                              "| first | ssd | 200.0 |  | +0.5, -3.0 |\n\nNote one.\n\nNote two.\n\n**A**: ")
    assert "**A**: 2026-01-02T03:04:05Z; load average 0.50, 0.25, 0.12 (1, 5, 15 min) when written; " \
           "Test CPU, 4 cores, MPICH 9; [data](docs/figures/a/result.json)." in section
    assert "```bash\nssdmpi bench train --net 1gbit --out OUT\n```" in section
    assert "| cpu | Test CPU |" in text.split("## Machines")[1]


def test_links_are_relative_to_the_page(tmp_path):
    results = make_page(tmp_path, [SPEEDUP])
    (tmp_path / "out").mkdir()
    text = report.render(results, tmp_path / "out")
    assert "[A](../docs/figures/a/result.json)" in text


@pytest.mark.parametrize("damage, message", [
    (lambda r: (r / "speed.json").write_text("{not json"), "not valid JSON"),
    (lambda r: (r / "speed.json").write_text(json.dumps({"results": {}})), "needs a \"title\""),
    (lambda r: (r / "page.md").write_text("no placeholders"), "lacks the placeholder"),
    (lambda r: (r.parent / "figures" / "a" / "result.json").write_text("{}"), "not a result file"),
    (lambda r: (r.parent / "figures" / "b" / "result.json").unlink(), "cannot read it"),
])
def test_broken_data_is_a_one_line_error(tmp_path, damage, message):
    results = make_page(tmp_path, [SPEEDUP])
    damage(results)
    with pytest.raises(UserError, match=message):
        report.render(results, tmp_path)


def test_the_command_writes_the_page_and_check_finds_drift(tmp_path):
    results = make_page(tmp_path, [SPEEDUP])
    out = tmp_path / "PAGE.md"
    args = ["bench", "report", "--results", str(results), "--out", str(out)]
    assert run_cli(args).returncode == 0
    assert out.read_text() == report.render(results, tmp_path)
    assert run_cli(args + ["--check"]).returncode == 0
    out.write_text(out.read_text().replace("2.50x", "9.99x"))
    proc = run_cli(args + ["--check"])
    assert proc.returncode == 1 and "is not the render of" in proc.stderr
    assert "9.99x" in out.read_text()                       # --check writes nothing


def test_a_missing_results_directory_is_exit_2_and_one_line(tmp_path):
    proc = run_cli(["bench", "report", "--results", str(tmp_path / "none"), "--out", str(tmp_path / "P.md")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "no such directory" in proc.stderr
    assert not (tmp_path / "P.md").exists()


def test_long_commands_wrap_before_flags_and_keep_quoted_arguments_whole():
    command = ("ssdmpi bench train --out OUT --net 1gbit --variants ssgd,ssd:period:5 --model wide-mlp "
               "--train-subset 3200 --epochs 3 --seed 0 --train-args \"--log-every 5 --keep-checkpoints 1\"")
    wrapped = report.wrap_command(command, width=60)
    lines = wrapped.split(" \\\n    ")
    assert len(lines) > 1 and all(line.startswith("--") for line in lines[1:])
    assert " ".join(lines) == command                        # nothing lost or reordered
    assert any(line.endswith('--train-args "--log-every 5 --keep-checkpoints 1"') for line in lines)
    assert report.wrap_command("mpiexec -n 2 ssdmpi bench comm") == "mpiexec -n 2 ssdmpi bench comm"


# ----------------------------------------------------------------------------- the result files

def test_provenance_names_the_command_the_machine_and_the_time():
    p = provenance("comm", ["bench", "comm", "--sizes", "1M,4M", "--json", "a b.json"])
    assert p["format"] == FORMAT and p["benchmark"] == "comm"
    assert p["command"] == "ssdmpi bench comm --sizes 1M,4M --json 'a b.json'"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["date"])
    m = machine()
    assert m["cores"] >= 1 and 1 <= m["usable_cpus"] <= m["cores"] and m["cpu"] and m["python"]
    assert m["mpi"] and m["numpy"] and m["mpi4py"]
    assert command_line(["train"]) == "ssdmpi train"


def test_bench_train_writes_its_rows_as_a_result_file(tmp_path):
    synthetic_bench(tmp_path)
    proc = run_cli(["bench", "train", "--out", str(tmp_path), "--variants", "ssgd,ssd:period:5", "--reuse"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "result.json").read_text())
    assert data["format"] == FORMAT and data["benchmark"] == "train"
    assert data["command"].startswith("ssdmpi bench train --out ") and "--reuse" in data["command"]
    assert data["settings"].startswith("ssdmpi bench train: wide-mlp on fashion-mnist, 2 ranks, net 1gbit")
    assert data["machine"]["cores"] >= 1 and len(data["load_average"]) == 3
    with open(tmp_path / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["name"] for r in data["rows"]] == [r["name"] for r in table] == ["ssgd", "ssd-period-k5"]
    for row, csv_row in zip(data["rows"], table):
        assert set(row) == set(csv_row)
        for key, value in row.items():
            assert (str(value) if value is not None else "") == csv_row[key], key
    assert data["rows"][1]["speedup"] == pytest.approx(2.5)
    assert "summarised" not in data


def test_a_result_written_again_from_the_same_runs_keeps_when_and_where_they_ran(tmp_path):
    """--reuse with nothing left to run: the rows are summarised again (here after the bounds' rule
    changed), the provenance stays the runs' (command, date, machine, load), ``summarised`` says when."""
    synthetic_bench(tmp_path)
    first = run_cli(["bench", "train", "--out", str(tmp_path), "--variants", "ssgd,ssd:period:5", "--reuse"])
    assert first.returncode == 0, first.stderr
    runs = json.loads((tmp_path / "result.json").read_text())
    runs.update(command="ssdmpi bench train --out X --variants ssgd,ssd:period:5", date="2026-01-02T03:04:05Z",
                load_average=[3.5, 3.0, 2.5], machine={"cpu": "the runs' cpu"})
    (tmp_path / "result.json").write_text(json.dumps(runs))
    again = run_cli(["bench", "train", "--out", str(tmp_path), "--variants", "ssgd,ssd:period:5", "--reuse"])
    assert again.returncode == 0, again.stderr
    data = json.loads((tmp_path / "result.json").read_text())
    for key in ("command", "date", "load_average", "machine"):
        assert data[key] == runs[key], key
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["summarised"])
    assert data["rows"] == runs["rows"]


def test_bench_engine_json_is_a_result_file(monkeypatch, capsys):
    """The engine's measurement (PyTorch's side) is stubbed: what is checked is what --json writes."""
    from ssdmpi.bench import engine
    from ssdmpi.cli import build_parser

    measured = {"model": "mlp", "batch": 4, "ratio": 0.9, "target_met": None}
    monkeypatch.setattr(engine, "measure", lambda *a, **k: dict(measured))
    argv = ["bench", "engine", "--model", "mlp", "--json", "-"]
    monkeypatch.setattr("sys.argv", ["ssdmpi"] + argv)
    args = build_parser().parse_args(argv)
    assert args.run(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == FORMAT and data["benchmark"] == "engine"
    assert data["command"] == "ssdmpi bench engine --model mlp --json -"
    assert data["machine"]["cores"] >= 1
    assert {k: data[k] for k in measured} == measured


def test_bench_threads_json_is_a_result_file_with_one_row_per_rank_count(tmp_path, monkeypatch):
    """The training runs are stubbed (wall and run seconds by side): what is checked is the file."""
    from ssdmpi.bench import threads

    seconds = {"auto": (3.0, 1.2), "OMP_NUM_THREADS=1": (2.0, 1.0), threads.UNLIMITED: (30.0, 25.0)}
    monkeypatch.setattr(threads, "one_run", lambda launcher, n, side, args, workdir: {
        "wall_s": seconds[side][0] * n, "train_s": seconds[side][1] * n, "placement": "1 thread"})
    out = tmp_path / "threads.json"
    argv = ["--ranks", "2,4", "--pairs", "1", "--unlimited-runs", "1", "--json", str(out)]
    monkeypatch.setattr("sys.argv", ["threads.py"] + argv)
    assert threads.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["format"] == FORMAT and data["benchmark"] == "threads"
    assert data["command"] == f"python -m ssdmpi.bench.threads --ranks 2,4 --pairs 1 --unlimited-runs 1 --json {out}"
    assert data["rows"] == [
        {"ranks": n, "bare_wall_s": 3.0 * n, "bare_run_s": 1.2 * n, "omp1_wall_s": 2.0 * n, "omp1_run_s": 1.0 * n,
         "unlimited_wall_s": 30.0 * n, "unlimited_run_s": 25.0 * n, "ratio_wall": 1.5, "ratio_run": pytest.approx(1.2)}
        for n in (2, 4)]
