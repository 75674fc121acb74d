"""``ssdmpi bench accuracy`` on tiny settings (digits, MLP, a few dozen iterations).

What is checked: the table and CSV have one cell/row per configuration, ssgd's difference
to itself is 0 and every other difference is ``acc - acc(ssgd)`` of the row, the numbers
are the reference simulator's (recomputed here), ``--jobs 2`` gives the same numbers as
``--jobs 1``, ``--resume`` skips what is done, and bad arguments are one-line errors (exit 2).
"""

import csv
import os
import subprocess
import sys

import pytest

from ssdmpi.bench import accuracy
from ssdmpi.bench.accuracy import command, configs
from ssdmpi.bench.accuracy import simulate as accuracy_simulate
from ssdmpi.bench.accuracy import tables as accuracy_tables

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--dataset", "digits", "--models", "mlp", "--ranks", "1,2", "--delays", "2,3", "--epochs", "0.5",
        "--warmup-steps", "4", "--batch-size", "8", "--lr", "0.05",
        "--variants", "ssgd,step/global-momentum,period/delta-own,localsgd"]


def bench(args, timeout=120):
    """Run ``ssdmpi bench accuracy ARGS``."""
    cmd = [sys.executable, "-m", "ssdmpi", "bench", "accuracy"]
    env = dict(os.environ)
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("acc") / "sweep"
    proc = bench(TINY + ["--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_csv_has_one_row_per_configuration(sweep):
    out, _ = sweep
    rows = read_csv(out / "results.csv")
    assert list(rows[0]) == list(configs.FIELDS)
    # per N: ssgd once + 3 variants x 2 values of k
    assert len(rows) == 2 * (1 + 3 * 2)
    keys = {(r["N"], r["variant"], r["k"]) for r in rows}
    assert len(keys) == len(rows)
    assert {r["k"] for r in rows if r["variant"] == "ssgd"} == {"0"}
    for r in rows:
        assert 0 <= float(r["acc_W"]) <= 100
        assert int(r["steps"]) == round(0.5 * (1437 // (8 * int(r["N"]))))   # digits: 1437 training images


def test_result_file_holds_every_row_with_its_difference_and_the_command(sweep):
    import json

    out, _ = sweep
    data = json.loads((out / "result.json").read_text())
    assert data["format"] == "ssdmpi-bench-result/1" and data["benchmark"] == "accuracy"
    assert data["command"].startswith("ssdmpi bench accuracy --dataset digits --models mlp")
    assert data["machine"]["cores"] >= 1
    rows = read_csv(out / "results.csv")
    key = lambda r: (int(r["N"]), r["variant"], int(r["k"]))      # noqa: E731
    by_key = {key(r): r for r in data["rows"]}
    assert sorted(by_key) == sorted(key(r) for r in rows)
    for r in rows:
        row = by_key[key(r)]
        assert row["acc_W"] == float(r["acc_W"]) and row["steps"] == int(r["steps"])
        ssgd = next(float(s["acc_W"]) for s in rows if s["N"] == r["N"] and s["variant"] == "ssgd")
        assert row["diff_vs_ssgd"] == pytest.approx(float(r["acc_W"]) - ssgd, abs=0.006)


def tables(stdout: str) -> dict:
    """``{k: (column names, [cells of each row])}`` from the ``### k = K`` tables of the report."""
    out, k = {}, None
    for line in stdout.splitlines():
        if line.startswith("### k = "):
            k = int(line.split("=")[1])
        elif line.startswith("| model |"):
            out[k] = ([c.strip() for c in line.strip("|").split("|")], [])
        elif line.startswith("| mlp |"):
            out[k][1].append([c.strip() for c in line.strip("|").split("|")])
    return out


def test_table_cells_are_accuracy_and_difference_to_ssgd(sweep):
    out, proc = sweep
    rows = read_csv(out / "results.csv")
    acc = {(r["N"], r["variant"], r["k"]): float(r["acc_W"]) for r in rows}
    found = tables(proc.stdout)
    assert sorted(found) == [2, 3]                                # one table per k
    for k, (columns, lines) in found.items():
        assert columns == ["model", "lr", "N", "ssgd", f"step/global-momentum k={k}", f"period/delta-own k={k}",
                           f"localsgd k={k}"]
        assert len(lines) == 2                                    # rows model x lr x N
        for cells in lines:
            n = cells[2]
            assert cells[1] == "0.05"
            ref = acc[(n, "ssgd", "0")]
            assert cells[3] == f"{ref:.2f} [+0.00]"               # ssgd's difference to itself
            for column, cell in zip(columns[4:], cells[4:]):
                variant = column.split(" k=")[0]
                a = acc[(n, variant, str(k))]
                assert cell == f"{a:.2f} [{a - ref:+.2f}]"
    assert (out / "results.md").read_text().count("| mlp |") == 4


def test_lists_of_lr_and_seeds_give_means_paired_differences_and_ranges(tmp_path):
    """Two learning rates x two seeds: a cell is the mean over the seeds, the mean of the differences
    to the same seed's ssgd, and the range; delta-merge:d=3 is skipped at k = 2 (d > k)."""
    out = tmp_path / "grid"
    args = list(TINY)
    args[args.index("--lr") + 1] = "0.05,0.02"
    args[args.index("--variants") + 1] = "ssgd,period/delta-merge:d=3,localsgd"
    proc = bench(args + ["--seed", "0,1", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(out / "results.csv")
    # per seed, lr and N: ssgd + localsgd x 2 k + delta-merge:d=3 at k = 3 only
    assert len(rows) == 2 * 2 * 2 * (1 + 2 + 1)
    assert not [r for r in rows if r["variant"] == "period/delta-merge:d=3" and r["k"] == "2"]
    acc = {(r["lr"], r["N"], r["variant"], r["k"], r["seed"]): float(r["acc_W"]) for r in rows}
    found = tables(proc.stdout)
    assert found[2][0][-1] == "localsgd k=2" and "period/delta-merge:d=3 k=2" not in found[2][0]
    columns, lines = found[3]
    assert columns == ["model", "lr", "N", "ssgd", "period/delta-merge:d=3 k=3", "localsgd k=3"]
    assert [(c[1], c[2]) for c in lines] == [("0.05", "1"), ("0.05", "2"), ("0.02", "1"), ("0.02", "2")]
    for cells in lines:
        lr, n = repr(float(cells[1])), cells[2]
        for column, cell in zip(columns[3:], cells[3:]):
            variant, k = (column.split(" k=") + ["0"])[:2]
            runs = [acc[(lr, n, variant, k, s)] for s in "01"]
            diffs = [acc[(lr, n, variant, k, s)] - acc[(lr, n, "ssgd", "0", s)] for s in "01"]
            assert cell == (f"{sum(runs) / 2:.2f} [{sum(diffs) / 2:+.2f}] "
                            f"({min(runs):.2f}..{max(runs):.2f})")


def test_with_diffs_gives_zero_for_ssgd_and_blank_without_a_reference():
    rows = [dict(model="mlp", lr=0.1, N=2, variant="ssgd", k=0, seed=0, acc_W=80.0),
            dict(model="mlp", lr=0.1, N=2, variant="localsgd", k=5, seed=0, acc_W=81.5),
            dict(model="mlp", lr=0.1, N=4, variant="localsgd", k=5, seed=0, acc_W=70.0),
            dict(model="mlp", lr=0.1, N=2, variant="localsgd", k=5, seed=1, acc_W=70.0),
            dict(model="mlp", lr=0.2, N=2, variant="localsgd", k=5, seed=0, acc_W=70.0)]
    diffs = [r["diff_vs_ssgd"] for r in accuracy_tables.with_diffs(rows)]
    assert diffs == [0.0, 1.5, "", "", ""]
    rows[0]["acc_W_tail"], rows[1]["acc_W_tail"], rows[3]["acc_W_tail"] = "78.25", "77.0", "70.0"
    tails = [r["diff_tail_vs_ssgd"] for r in accuracy_tables.with_diffs(rows)]
    assert tails == [0.0, -1.25, "", "", ""]                        # seed 1 has no ssgd row to compare with


def test_numbers_are_the_reference_simulators(sweep):
    """Recompute one cell with the simulator directly: same loaders, steps, finalize, test set."""
    from ssdmpi.algos import AlgoConfig
    from ssdmpi.data import ShardedLoader, load_dataset
    from ssdmpi.nn import build_model
    from ssdmpi.verify.reference import simulate

    out, _ = sweep
    row = next(r for r in read_csv(out / "results.csv") if r["variant"] == "period/delta-own" and r["N"] == "2"
               and r["k"] == "3")
    ds = load_dataset("digits")
    loaders = [ShardedLoader(ds.train_x, ds.train_y, 8, r, 2, 0) for r in range(2)]
    cfg = AlgoConfig(algo="ssd", comm="period", period_rule="delta-own", delay=3, warmup_steps=4, lr=0.05)
    sim = simulate(cfg, lambda: build_model("mlp", ds.input_shape, ds.num_classes, seed=0, widths=(256,)),
                   loaders, int(row["steps"]))
    sim.finalize()
    acc, _ = sim.accuracy(sim.W, ds.test_x, ds.test_y)
    assert float(row["acc_W"]) == round(100 * acc, 2)


def test_tail_iterations_spread_over_the_second_half_and_end_at_the_end():
    assert accuracy_simulate.tail_iterations(10, 4) == [6, 7, 8, 10]
    assert accuracy_simulate.tail_iterations(100, 5) == [60, 70, 80, 90, 100]
    assert accuracy_simulate.tail_iterations(4, 5) == [3, 4]                  # fewer iterations than asked: each once
    assert accuracy_simulate.tail_iterations(100, 0) == []


def test_tail_is_the_mean_accuracy_of_runs_stopped_and_finalized_there(tmp_path):
    """``--tail 3``: the mean over the 3 tail iterations of a simulation stopped there and finalized
    (computed here from scratch), and a second table of it; the final figure is unchanged by it."""
    from ssdmpi.algos import AlgoConfig
    from ssdmpi.data import ShardedLoader, load_dataset
    from ssdmpi.nn import build_model
    from ssdmpi.verify.reference import simulate

    out = tmp_path / "tail"
    args = TINY[:-1] + ["ssgd,period/delta-merge", "--ranks", "2", "--delays", "3"]
    proc = bench(args + ["--tail", "3", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    rows = {r["variant"]: r for r in read_csv(out / "results.csv")}
    row = rows["period/delta-merge"]
    steps = int(row["steps"])
    ds = load_dataset("digits")
    cfg = AlgoConfig(algo="ssd", comm="period", period_rule="delta-merge", delay=3, warmup_steps=4, lr=0.05)
    accs = []
    for t in accuracy_simulate.tail_iterations(steps, 3):
        loaders = [ShardedLoader(ds.train_x, ds.train_y, 8, r, 2, 0) for r in range(2)]
        sim = simulate(cfg, lambda: build_model("mlp", ds.input_shape, ds.num_classes, seed=0, widths=(256,)),
                       loaders, t)
        sim.finalize()
        accs.append(sim.accuracy(sim.W, ds.test_x, ds.test_y)[0])
    assert len(accs) == 3 and (steps - 4) % 3 != 0                  # the end falls mid-period: finalize matters
    assert float(row["acc_W_tail"]) == round(100 * sum(accs) / len(accs), 2)
    assert float(row["acc_W"]) == round(100 * accs[-1], 2) and row["tail"] == "3"
    plain = bench(args + ["--out", str(tmp_path / "plain")])
    assert {r["variant"]: r["acc_W"] for r in read_csv(tmp_path / "plain" / "results.csv")} == \
        {v: r["acc_W"] for v, r in rows.items()}
    tail_table = proc.stdout.split("### k = 3 (tail: mean over 3 evaluations in the second half)")[1]
    cells = next(line for line in tail_table.splitlines() if line.startswith("| mlp |")).strip("|").split("|")
    ssgd, merge = float(rows["ssgd"]["acc_W_tail"]), float(row["acc_W_tail"])
    assert [c.strip() for c in cells[3:]] == [f"{ssgd:.2f} [+0.00]", f"{merge:.2f} [{merge - ssgd:+.2f}]"]
    assert "(tail:" not in plain.stdout


def test_resume_reads_a_sweep_written_before_the_tail_fields(tmp_path):
    """A results.csv without ``tail``/``acc_W_tail`` counts as ``--tail 0``: resumed, its rows are kept
    (not run again) and the file is rewritten with every field."""
    out = tmp_path / "old"
    args = TINY[:-1] + ["ssgd,localsgd", "--ranks", "2", "--delays", "2"]
    assert bench(args + ["--out", str(out)]).returncode == 0
    rows = read_csv(out / "results.csv")
    old = [f for f in configs.FIELDS if f not in ("tail", "acc_W_tail")]
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    again = bench(args + ["--out", str(out), "--resume"])
    assert again.returncode == 0, again.stderr
    assert "resume: 2 configuration(s)" in again.stderr and "[1/" not in again.stderr
    upgraded = read_csv(out / "results.csv")
    assert list(upgraded[0]) == list(configs.FIELDS)
    assert [(r["variant"], r["acc_W"], r["tail"], r["acc_W_tail"]) for r in upgraded] == \
        [(r["variant"], r["acc_W"], "0", "") for r in rows]


def test_two_jobs_give_the_same_numbers(sweep, tmp_path):
    out, _ = sweep
    proc = bench(TINY + ["--jobs", "2", "--out", str(tmp_path / "j2")])
    assert proc.returncode == 0, proc.stderr
    key = lambda r: (r["N"], r["variant"], r["k"])                # noqa: E731
    one = {key(r): r["acc_W"] for r in read_csv(out / "results.csv")}
    two = {key(r): r["acc_W"] for r in read_csv(tmp_path / "j2" / "results.csv")}
    assert one == two


def test_a_configuration_runs_with_one_blas_thread_whatever_the_callers_limit(monkeypatch):
    """More BLAS threads sum a product in another order; at lr 0.1 that moves the final accuracy by
    points, so each configuration pins one thread (the table must not depend on the cores)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from ssdmpi.verify import reference

    seen = []

    def spy(*args, **kwargs):
        seen.append(max(pool["num_threads"] for pool in threadpool_info()))
        return real(*args, **kwargs)

    real = reference.simulate
    monkeypatch.setattr(reference, "simulate", spy)
    cfg = dict(ASGD_CFG, variant="ssgd", N=1, epochs=0.05)
    with threadpool_limits(limits=2):
        row = accuracy_simulate.run_config(cfg)
    assert seen == [1] and 0 <= row["acc_W"] <= 100


def test_resume_skips_done_configurations_and_runs_the_rest(tmp_path):
    out = tmp_path / "r"
    first = bench(TINY[:-1] + ["ssgd,localsgd", "--out", str(out)])
    assert first.returncode == 0, first.stderr
    assert len(read_csv(out / "results.csv")) == 2 * (1 + 2)
    refused = bench(TINY + ["--out", str(out)])
    assert refused.returncode == 2 and "not empty" in refused.stderr
    second = bench(TINY + ["--out", str(out), "--resume"])
    assert second.returncode == 0, second.stderr
    assert "resume: 6 configuration(s)" in second.stderr
    rows = read_csv(out / "results.csv")
    assert len(rows) == 2 * (1 + 3 * 2)                            # only the missing ones were added
    assert len({(r["N"], r["variant"], r["k"]) for r in rows}) == len(rows)


def test_no_run_renders_the_rows_there_and_marks_cells_short_of_seeds(tmp_path):
    """A sweep over seeds 0 and 1 of which only seed 0 ran: ``--resume --no-run`` runs nothing (the CSV
    is unchanged), and each cell of seed 0 alone says it has 1 of the 2 seeds."""
    out = tmp_path / "partial"
    args = TINY[:-1] + ["ssgd,localsgd", "--ranks", "2", "--delays", "2"]
    first = bench(args + ["--seed", "0", "--out", str(out)])
    assert first.returncode == 0, first.stderr
    before = (out / "results.csv").read_text()
    rows = read_csv(out / "results.csv")
    acc = {r["variant"]: float(r["acc_W"]) for r in rows}
    rendered = bench(args + ["--seed", "0,1", "--out", str(out), "--resume", "--no-run"])
    assert rendered.returncode == 0, rendered.stderr
    assert (out / "results.csv").read_text() == before
    columns, lines = tables(rendered.stdout)[2]
    assert columns == ["model", "lr", "N", "ssgd", "localsgd k=2"] and len(lines) == 1
    ssgd, local = acc["ssgd"], acc["localsgd"]
    assert lines[0][3:] == [f"{ssgd:.2f} [+0.00] (1 of 2 seeds)", f"{local:.2f} [{local - ssgd:+.2f}] (1 of 2 seeds)"]
    assert "(2 configuration(s) not run yet" in rendered.stdout
    assert (out / "results.md").read_text().rstrip() == rendered.stdout.rstrip()
    refused = bench(args + ["--no-run"])
    assert refused.returncode == 2 and "--no-run" in refused.stderr and not refused.stdout


@pytest.mark.parametrize("args, words", [
    (["--variants", "ssgd,foo"], "--variants: unknown foo"),
    (["--models", "resnet"], "--models: unknown resnet"),
    (["--delays", "0"], "--delays must be comma-separated integers >= 1"),
    (["--delays", "2,x"], "--delays must be comma-separated integers"),
    (["--ranks", "0"], "--ranks must be comma-separated integers >= 1"),
    (["--lr", "0"], "--lr must be comma-separated numbers > 0"),
    (["--seed", "-1"], "--seed must be comma-separated integers >= 0"),
    (["--variants", "period/delta-merge:d=0"], "--variants: unknown period/delta-merge:d=0"),
    (["--variants", "localsgd:d=1"], "--variants: unknown localsgd:d=1"),
    (["--variants", "period/delta-merge:d=2:d=3"], "--variants: unknown period/delta-merge:d=2:d=3"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--epochs", "-1"], "--epochs must be > 0"),
    (["--epochs", "mlp=3"], "gives no epochs for lenet5"),
    (["--warmup-steps", "-1"], "--warmup-steps must be >= 0"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--tail", "-1"], "--tail must be >= 0"),
    (["--train-subset", "10"], "smaller than one global batch"),
    (["--resume"], "--resume needs --out"),
])
def test_bad_arguments_are_one_line_errors(args, words):
    proc = bench(args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert proc.stdout == ""


def test_out_must_not_be_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("mine")
    proc = bench(TINY + ["--out", str(f)])
    assert proc.returncode == 2 and "not a directory" in proc.stderr
    assert f.read_text() == "mine"


def test_subset_larger_than_the_data_is_an_error():
    proc = bench(TINY + ["--train-subset", "100000"])
    assert proc.returncode == 2 and "more than the 1437 training samples" in proc.stderr


ASGD_CFG = dict(model="mlp", variant="asgd", k=0, dataset="digits", lr=0.05, batch_size=8, epochs=0.5,
                warmup_steps=4, momentum=0.9, weight_decay=1e-4, train_subset=0, seed=0, tail=0)


def test_asgd_variant_is_the_reference_asgd_with_one_server_in_round_robin_order():
    """The asgd cell of N = 2 workers is ``ASGDSimulation`` on 3 ranks (2 workers + 1 server),
    the loaders sharding the data over the 2 workers only."""
    from ssdmpi.algos import AlgoConfig
    from ssdmpi.data import ShardedLoader, load_dataset
    from ssdmpi.nn import build_model
    from ssdmpi.verify.reference import ASGDSimulation, simulate

    row = accuracy_simulate.run_config(dict(ASGD_CFG, N=2))
    ds = load_dataset("digits")
    loaders = [ShardedLoader(ds.train_x, ds.train_y, 8, w, 2, 0) for w in range(2)]
    cfg = AlgoConfig(algo="asgd", servers=1, asgd_order="round-robin", warmup_steps=4, lr=0.05)
    sim = simulate(cfg, lambda: build_model("mlp", ds.input_shape, ds.num_classes, seed=0, widths=(256,)),
                   loaders, int(row["steps"]), world_size=3)
    assert isinstance(sim, ASGDSimulation) and sim.K == 2 and sim.t == int(row["steps"])
    assert int(row["steps"]) == round(0.5 * (1437 // (8 * 2))) and sim.t > 4     # past the warm-up
    acc, _ = sim.accuracy(sim.W, ds.test_x, ds.test_y)
    assert float(row["acc_W"]) == round(100 * acc, 2)


def test_asgd_with_one_worker_is_ssgd_with_one_worker():
    """ALGORITHM.md 11: with one worker, ASGD is plain momentum SGD, so its cell equals ssgd's."""
    asgd = accuracy_simulate.run_config(dict(ASGD_CFG, N=1))
    ssgd = accuracy_simulate.run_config(dict(ASGD_CFG, N=1, variant="ssgd"))
    assert asgd["steps"] == ssgd["steps"] > 4
    assert asgd["acc_W"] == ssgd["acc_W"]


def test_asgd_has_one_column_like_ssgd():
    args = accuracy_args(variants="ssgd,asgd,localsgd", delays="2,5")
    configs, _ = command.parse(args)
    assert sorted((c["variant"], c["k"]) for c in configs if c["N"] == 2 and c["model"] == "mlp") == \
        [("asgd", 0), ("localsgd", 2), ("localsgd", 5), ("ssgd", 0)]
    rows = [dict(model="mlp", lr=0.02, N=2, variant=v, k=k, seed=0, acc_W=a) for v, k, a in
            [("ssgd", 0, 80.0), ("asgd", 0, 78.5), ("localsgd", 2, 79.0), ("localsgd", 5, 79.5)]]
    for k in (2, 5):
        text = accuracy_tables.table(rows, ["mlp"], [0.02], [2], ["ssgd", "asgd", "localsgd"], k)
        assert text.splitlines()[0] == f"| model | lr | N | ssgd | asgd | localsgd k={k} |"
        assert "| 78.50 [-1.50] |" in text


def accuracy_args(**overrides):
    import argparse

    parser = argparse.ArgumentParser()
    accuracy.add_arguments(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_every_variant_a_doc_runs_with_bench_accuracy_is_known():
    """The commands in the docs run as written: each ``--variants`` of an ``ssdmpi bench accuracy``
    line names variants the bench takes (``asgd/plain`` included)."""
    import glob
    import re

    named = set()
    for path in glob.glob(os.path.join(ROOT, "docs", "*.md")) + [os.path.join(ROOT, "README.md")]:
        with open(path, encoding="utf-8") as f:
            text = f.read().replace("\\\n", " ")
        for line in text.splitlines():
            if "bench accuracy" in line:
                for match in re.finditer(r"--variants\s+([^\s`]+)", line):
                    named.update(v for v in match.group(1).split(",") if v and not v.startswith("$"))
    assert "asgd/plain" in named and "period/delta-merge:d=1:mom=1" in named, sorted(named)
    unknown = sorted(v for v in named if not configs.known(v))
    assert unknown == [], f"variants in the docs that bench accuracy refuses: {unknown}"
