"""``bench train`` / ``bench model`` with asgd variants and ``--nodes``: parsing, launch commands,
the parameter-server alpha-beta term (against a hand computation), bad input.

No MPI and no cluster here (``--dry-run``, pure functions, synthetic run directories);
tests/cluster/test_bench.py runs ``bench train --nodes 2`` for real.
"""

import json
import shlex

import pytest

from tests.conftest import run_cli


def test_asgd_variants_parse_to_servers_and_train_flags():
    from ssdmpi.bench.variants import parse_variant

    v = parse_variant("asgd:2")
    assert (v.name, v.algo, v.servers) == ("asgd-s2", "asgd", 2)
    assert v.train_flags() == ["--algo", "asgd", "--servers", "2"]
    assert parse_variant("asgd").train_flags() == ["--algo", "asgd", "--servers", "1"]
    assert parse_variant("asgd:1").name == "asgd-s1"


@pytest.mark.parametrize("spec", ["asgd:0", "asgd:x", "asgd:1:2", "asgd:-1"])
def test_bad_asgd_variants_are_one_line_errors(tmp_path, spec):
    result = run_cli(["bench", "train", "--out", str(tmp_path / "o"), "--dry-run", "--variants", spec])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "asgd:S" in lines[0], result.stderr


def test_asgd_servers_come_on_top_of_the_workers_in_one_namespace(tmp_path):
    result = run_cli(["bench", "train", "--out", str(tmp_path / "b"), "--variants", "ssgd,asgd:2", "--dry-run"])
    assert result.returncode == 0, result.stderr
    ssgd, asgd = result.stdout.splitlines()
    assert "mpiexec -n 2 " in ssgd and "mpiexec -n 4 " in asgd
    assert asgd.endswith("--algo asgd --servers 2")


def test_nodes_run_every_variant_on_the_cluster_servers_on_nodes_of_their_own(tmp_path):
    result = run_cli(["bench", "train", "--out", str(tmp_path / "b"), "--variants", "ssgd,asgd:1",
                      "--nodes", "2", "--net", "100mbit", "--dry-run"])
    assert result.returncode == 0, result.stderr
    ssgd, asgd = (shlex.split(line) for line in result.stdout.splitlines())
    assert ssgd[1].endswith("bin/ssdmpi-cluster") and "mpiexec" not in " ".join(ssgd)
    cut = ssgd.index("--")
    assert ssgd[2:cut] == ["--name", "ssdmpi-bench", "run", "--nodes", "2", "--ranks-per-node", "1",
                           "--nic", "100mbit"]
    assert ssgd[cut + 2:cut + 4] == ["-m", "ssdmpi"] and "ssdmpi-netns" not in " ".join(ssgd)
    assert asgd[asgd.index("--nodes") + 1] == "3"      # 2 workers + 1 server node


def test_ranks_per_node_multiplies_and_net_none_means_unlimited_nics(tmp_path):
    result = run_cli(["bench", "train", "--out", str(tmp_path / "b"), "--variants", "ssgd", "--nodes", "2",
                      "--ranks-per-node", "2", "--net", "none", "--dry-run"])
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert argv[argv.index("--ranks-per-node") + 1] == "2" and argv[argv.index("--nic") + 1] == "unlimited"


@pytest.mark.parametrize("flags, message", [
    (["--nodes", "0"], "--nodes must be a positive"),
    (["--nodes", "-2"], "--nodes must be a positive"),
    (["--ranks-per-node", "2"], "--ranks-per-node needs --nodes"),
    (["--nodes", "2", "--ranks-per-node", "0"], "--ranks-per-node must be"),
    (["--nodes", "2", "--ranks", "3"], "contradicts"),
    (["--nodes", "2", "--ranks-per-node", "2", "--variants", "asgd:1"], "--ranks-per-node 1"),
])
@pytest.mark.parametrize("command", ["train", "model"])
def test_bad_node_arguments_are_one_line_errors(tmp_path, flags, message, command):
    if command == "model":
        if "--variants" in flags:
            flags = ["--nodes", "2", "--patterns", "asgd:2"]
            message = "leave no worker"
        extra = []
    else:
        extra = ["--out", str(tmp_path / "o"), "--dry-run"]
    result = run_cli(["bench", command, *extra, *flags])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "o").exists()


def test_nodes_without_root_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    from ssdmpi.bench import launch
    from ssdmpi.cli import main
    from ssdmpi.cluster import nodes

    monkeypatch.setattr(nodes.os, "geteuid", lambda: 1000)
    assert main(["bench", "train", "--out", str(tmp_path / "o"), "--variants", "ssgd", "--nodes", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs root" in err[0] and "--nodes" in err[0]
    monkeypatch.setattr(launch, "CLUSTER", tmp_path / "none")
    assert main(["bench", "model", "--nodes", "2"]) == 2
    assert "needs" in capsys.readouterr().err


# --- the parameter-server model ---------------------------------------------------------------

def test_ps_step_time_against_a_hand_computation():
    from ssdmpi.bench.model.alphabeta import ps_step_time

    c, S, a, b = 0.2, 80e6, 1e-4, 8e-9          # 80 MB at 1 Gbit/s: S b = 0.64 s
    # NIC per rank, 2 workers, 1 server: worker cycle 0.2 + 2e-4 + 1.28 = 1.4802; server NIC 2 (1e-4 + 0.64)
    assert ps_step_time(c, S, 2, 1, a, b) == pytest.approx(1.4802)
    # 4 workers, 1 server: the server's NIC carries 4 pushes of 0.64 s: 4 (1e-4 + 0.64) = 2.5604 > 1.4802
    assert ps_step_time(c, S, 4, 1, a, b) == pytest.approx(2.5604)
    # 4 workers, 2 servers: each server 4 (1e-4 + 0.32) = 1.2804 < the worker's 1.4802
    assert ps_step_time(c, S, 4, 2, a, b) == pytest.approx(1.4802)
    # a server update of 0.1 s for the whole buffer, 2 servers: 0.05 s each, in both terms
    assert ps_step_time(c, S, 4, 2, a, b, server_update=0.1) == pytest.approx(max(1.5302, 4 * (1e-4 + 0.32 + 0.05)))
    # one shared link: worker 0.2 + 2e-4 + 0.64 = 0.8402; link 2 x 0.64 = 1.28
    assert ps_step_time(c, S, 2, 1, a, b, shared_link=True) == pytest.approx(1.28)
    assert ps_step_time(2.0, S, 2, 1, a, b, shared_link=True) == pytest.approx(2.6402)
    with pytest.raises(ValueError):
        ps_step_time(c, S, 0, 1, a, b)


def test_asgd_pattern_parses_and_is_named_by_its_servers():
    from ssdmpi.bench.model.alphabeta import Pattern, parse_pattern
    from ssdmpi.errors import UserError

    assert parse_pattern("servers:2") == Pattern("servers", 2) and parse_pattern("servers") == Pattern("servers", 1)
    # an algorithm's name stands for its pattern
    assert parse_pattern("asgd:2") == Pattern("servers", 2) and parse_pattern("asgd") == Pattern("servers", 1)
    assert Pattern("servers", 1).name == "asgd 1 server" and Pattern("servers", 2).name == "asgd 2 servers"
    with pytest.raises(UserError, match="asgd:S"):
        parse_pattern("asgd:0")


def measured_at(ranks, alpha, beta, c, grad=80_000_000, patterns=(("blocking", 1), ("period", 5), ("servers", 1))):
    """A synthetic ``measure()`` result whose allreduce times follow the ring model exactly."""
    from ssdmpi.bench.model.alphabeta import Pattern, predict_step, ps_step_time, ring_allreduce_time

    sizes = [4_000_000, 16_000_000, 64_000_000, grad]
    T = ring_allreduce_time(grad, ranks, alpha, beta)
    step = {"compute only": c}
    for kind, k in patterns:
        step[Pattern(kind, k).name] = (ps_step_time(c, grad, ranks - k, k, alpha, beta) if kind == "servers"
                                       else predict_step(kind, c, T, k)) * 1.1     # measured 10% slower
    return {"model": "m", "num_params": grad // 4, "grad_bytes": grad, "batch_size": 32, "ranks": ranks,
            "fit_bytes": sizes[:3], "check_bytes": sizes[3:],
            "allreduce_s": {str(n): ring_allreduce_time(n, ranks, alpha, beta) for n in sizes},
            "step_s": step, "compute_busy_s": c, "allreduce_busy_s": T,
            "patterns": [["none", 1]] + [list(p) for p in patterns]}


def test_fit_from_two_nodes_predicts_four_nodes_with_every_point_held_out():
    from ssdmpi.bench.model.alphabeta import analyse
    from ssdmpi.bench.model.report import report

    alpha, beta = 2e-4, 8e-9
    two = analyse(measured_at(2, alpha, beta, 0.25), rate_bps=1e9, shared_link=False)
    assert two["alpha_s"] == pytest.approx(alpha) and two["beta_s_per_byte"] == pytest.approx(beta)
    assert two["efficiency"] == pytest.approx(1.0) and two["fit_ranks"] == 2
    # the 4-node run: its own c (0.5 s: oversubscribed), link from the 2-node result only
    four = measured_at(4, alpha, beta, 0.5)
    four["allreduce_s"] = {n: 2 * t for n, t in four["allreduce_s"].items()}   # what the fit must NOT see
    r = analyse(four, rate_bps=1e9, fit_from=json.loads(json.dumps(two)), shared_link=False)
    assert r["alpha_s"] == pytest.approx(alpha) and r["fit_from_file"]
    assert not any(s["fitted"] for s in r["sizes"])
    assert all(s["error_pct"] == pytest.approx(-50.0) for s in r["sizes"])
    steps = {s["pattern"]: s for s in r["steps"]}
    for name in ("ssgd", "ssd period k=5", "asgd 1 server"):
        assert steps[name]["error_pct"] == pytest.approx(100 * (1 / 1.1 - 1))
    # asgd at 4 ranks: 3 workers on 1 server, server-bound: 3 (alpha + 80e6 beta)
    assert steps["asgd 1 server"]["predicted_s"] == pytest.approx(3 * (alpha + 0.64))
    text = report(four, r, "1gbit")
    assert "--fit-from" in text and "| asgd 1 server |" in text


def test_shared_link_doubles_the_efficiency_a_nic_per_rank_does_not():
    from ssdmpi.bench.model.alphabeta import analyse

    m = measured_at(2, 2e-4, 16e-9, 0.25)
    assert analyse(m, rate_bps=1e9)["efficiency"] == pytest.approx(1.0)          # 2 x 8 / (16e-9 1e9)
    assert analyse(m, rate_bps=1e9, shared_link=False)["efficiency"] == pytest.approx(0.5)


def test_fit_from_a_file_without_the_link_is_a_one_line_error(tmp_path):
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"model": {"alpha_s": 1e-4}}))
    for path, words in ((bad, "lacks"), (tmp_path / "missing.json", "not a readable")):
        result = run_cli(["bench", "model", "--fit-from", str(path)])
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr


# --- staleness in the bench train table -------------------------------------------------------

def test_staleness_is_the_step_weighted_mean_of_the_delay_stage(tmp_path):
    from ssdmpi.bench.rows import run_metrics, summarise
    from ssdmpi.bench.tables import markdown_table
    from ssdmpi.bench.variants import parse_variant
    from ssdmpi.rundir import load_run

    run_dir = tmp_path / "asgd-s1"
    run_dir.mkdir()
    records = [
        {"kind": "start", "config": {"algo": "asgd", "servers": 1}},
        {"kind": "step", "step": 10, "stage": "warmup", "staleness_mean": 0.0, "samples_per_s": 10},
        {"kind": "step", "step": 20, "stage": "async", "staleness_mean": 1.0, "samples_per_s": 100},
        {"kind": "step", "step": 25, "stage": "async", "staleness_mean": 2.5, "samples_per_s": 100},
        {"kind": "eval", "step": 25, "epoch": 1, "time": 5.0, "train_s": 4.0, "test_acc": 0.5},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    m = run_metrics(load_run(run_dir))
    assert m["staleness"] == pytest.approx((10 * 1.0 + 5 * 2.5) / 15)
    rows = summarise([parse_variant("asgd:1")], {"asgd-s1": [m]})
    assert rows[0]["staleness"] == pytest.approx(1.5)
    assert "| 1.500 |" in markdown_table(rows)
