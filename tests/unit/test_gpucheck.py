"""The GPU check script without a GPU: its no-GPU exit, its report writer, its runner (budgets,
partial results, exit status) driven with stand-in parts, and the harness of its comparisons
run on NumPy. What it checks ON a GPU is verified only where one is lent (docs/GPU.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ssdmpi import backend
from ssdmpi.gpucheck import run
from ssdmpi.gpucheck.report import PartLog, Report, part_status

ROOT = Path(__file__).resolve().parents[2]
GPU, WHY_NOT = backend.probe_cupy()


@pytest.mark.skipif(GPU is not None, reason="a GPU is usable here: the check runs instead")
@pytest.mark.parametrize("how", [["bin/ssdmpi-gpucheck"], ["-m", "ssdmpi.gpucheck"]])
def test_without_a_gpu_it_exits_2_with_one_line_and_no_traceback(tmp_path, how):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, *how, "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ssdmpi-gpucheck: no GPU: ")
    report = json.loads((out / "report.json").read_text())
    assert report["summary"].startswith("no GPU: ") and report["passed"] is False
    assert "no GPU: " in (out / "report.md").read_text()


def test_a_bad_part_name_is_one_line_and_exit_2(tmp_path, capsys):
    assert run.main(["--out", str(tmp_path), "--parts", "models,warp-drive"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown part(s) warp-drive" in err[0]


def test_an_unwritable_out_is_one_line_and_exit_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert run.main(["--out", str(blocker / "report")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write the report" in err[0]


def test_part_log_saves_after_every_check(tmp_path):
    path = tmp_path / "p.json"
    log = PartLog(str(path), "demo")
    assert json.loads(path.read_text())["checks"] == []
    log.check("first", True, value=np.float32(0.5), goal="<= 1")
    saved = json.loads(path.read_text())
    assert saved["checks"] == [{"name": "first", "ok": True, "value": 0.5, "goal": "<= 1", "detail": ""}]
    log.skip("second", "not here")
    log.note("a fact")
    saved = json.loads(path.read_text())
    assert saved["checks"][1]["ok"] is None and saved["notes"] == ["a fact"]


@pytest.mark.parametrize("checks, error, status", [
    ([True, None], None, "pass"),
    ([True, False], None, "fail"),
    ([None, None], None, "skip"),
    ([True], "exit status 1", "fail"),
    ([], None, "fail"),                  # a part that recorded nothing did not run
])
def test_part_status(checks, error, status):
    part = {"checks": [{"name": str(i), "ok": ok} for i, ok in enumerate(checks)], "error": error}
    assert part_status(part) == status


def test_report_writes_json_and_markdown_as_parts_arrive(tmp_path):
    report = Report(str(tmp_path), {"gpu": "a test GPU"})
    report.add({"part": "one", "checks": [{"name": "holds", "ok": True, "value": 1.0, "goal": "<= 2", "detail": ""}],
                "notes": ["n"], "seconds": 1.0, "budget_s": 10})
    assert json.loads((tmp_path / "report.json").read_text())["summary"].startswith("PASS: 1 parts passed")
    report.add({"part": "two", "checks": [{"name": "breaks | pipes", "ok": False, "value": {"ratio": 3.5},
                                           "goal": None, "detail": "x"}], "seconds": 2.0, "budget_s": 10})
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["passed"] is False and [p["status"] for p in data["parts"]] == ["pass", "fail"]
    md = (tmp_path / "report.md").read_text()
    assert "FAIL: 1 parts passed, 1 failed" in md and "| breaks / pipes | **FAIL** | ratio=3.5 |" in md
    assert "- gpu: a test GPU" in md


def test_a_part_killed_at_its_budget_keeps_what_it_recorded(tmp_path):
    part_file = tmp_path / "slow.json"
    code = ("import time, sys; from ssdmpi.gpucheck.report import PartLog; "
            f"log = PartLog({str(part_file)!r}, 'slow'); log.check('done before the hang', True); time.sleep(60)")
    record = run.run_part("slow", 3, [sys.executable, "-c", code], str(part_file), str(tmp_path / "slow.log"))
    assert "ran past its budget of 3 s" in record["error"] and record["seconds"] < 30
    assert [c["name"] for c in record["checks"]] == ["done before the hang"]
    assert part_status(record) == "fail"


def fake_parts(monkeypatch, outcomes: dict, aware=False):
    """Replace every part's command by a stand-in that records ``outcomes[part]``: "pass",
    "fail" (a failed check) or "crash" (exit 1 after one passing check)."""
    monkeypatch.setattr(run, "cuda_aware_mpi", lambda: (aware, "stand-in MPI"))

    def command(part, where, part_file, out_dir):
        outcome = outcomes.get(part, "pass")
        code = (f"import sys; from ssdmpi.gpucheck.report import PartLog; log = PartLog({part_file!r}, {part!r}); "
                f"log.check('c', {outcome != 'fail'}); sys.exit({1 if outcome == 'crash' else 0})")
        return [sys.executable, "-c", code]

    monkeypatch.setattr(run, "command", command)


@pytest.mark.parametrize("outcomes, code", [({}, 0), ({"overlap": "fail"}, 1), ({"engine": "crash"}, 1)])
def test_the_runner_exits_0_only_when_every_part_passed(tmp_path, monkeypatch, outcomes, code):
    fake_parts(monkeypatch, outcomes)
    args = run.parse(["--out", str(tmp_path)])
    assert run.run_all(args, [p for p, _, _ in run.PARTS], "a stand-in GPU", ["--out", str(tmp_path)]) == code
    data = json.loads((tmp_path / "report.json").read_text())
    status = {p["part"]: p["status"] for p in data["parts"]}
    assert list(status) == [p for p, _, _ in run.PARTS]
    assert status["algorithms-cuda-aware"] == "skip"              # the stand-in MPI is not CUDA-aware
    for part in outcomes:
        assert status[part] == "fail"
    assert data["cuda_aware_mpi"] == "stand-in MPI" and data["gpu"] == "a stand-in GPU"


def test_the_runner_stops_starting_parts_when_the_run_is_out_of_time(tmp_path, monkeypatch):
    fake_parts(monkeypatch, {}, aware=True)
    monkeypatch.setattr(run, "TOTAL_BUDGET", 0)
    args = run.parse(["--out", str(tmp_path), "--parts", "models,optimizers"])
    assert run.run_all(args, ["models", "optimizers"], "gpu", []) == 1
    parts = json.loads((tmp_path / "report.json").read_text())["parts"]
    assert [p["error"] for p in parts] == ["not run: the run's time was spent"] * 2


def test_two_rank_parts_start_mpiexec_with_their_transport(tmp_path):
    cmd = run.command("algorithms-cuda-aware", "two", "f.json", str(tmp_path))
    assert cmd[1:3] == ["-n", "2"] and cmd[-4:] == ["algorithms", "f.json", "--transport", "cuda-aware"]
    assert run.command("overlap", "two", "f.json", str(tmp_path))[-2:] == ["overlap", "f.json"]
    one = run.command("models", "one", "f.json", str(tmp_path))
    assert one[:3] == [sys.executable, "-m", "ssdmpi.gpucheck.parts"] and "models" in one


def test_cuda_awareness_detection(monkeypatch):
    monkeypatch.setenv("SSDMPI_GPUCHECK_CUDA_AWARE", "1")
    assert run.cuda_aware_mpi() == (True, "SSDMPI_GPUCHECK_CUDA_AWARE=1")
    monkeypatch.delenv("SSDMPI_GPUCHECK_CUDA_AWARE")
    if "MPICH" in run.mpi_library() and "cuda" not in run.mpi_library().lower():   # PyPI's mpich wheel
        aware, why = run.cuda_aware_mpi()
        assert aware is False and "not built with CUDA" in why


def test_the_budgets_fit_the_eight_minutes():
    assert sum(b for _, b, _ in run.PARTS) <= run.TOTAL_BUDGET <= 8 * 60


# -- the comparison harness itself, on NumPy (on a GPU it compares CuPy with NumPy) ---------

def test_the_optimizer_cases_are_deterministic_and_move_every_buffer():
    from ssdmpi.gpucheck.parts import optimizer_cases

    bufs_a, cases_a = optimizer_cases(np, n=5000)
    bufs_b, cases_b = optimizer_cases(np, n=5000)
    before = {k: v.copy() for k, v in bufs_a.items()}
    for name in cases_a:
        cases_a[name]()
        cases_b[name]()
    assert all(np.array_equal(bufs_a[k], bufs_b[k]) for k in bufs_a)
    assert {k for k in bufs_a if not np.array_equal(bufs_a[k], before[k])} == set("WMLPSD")   # G is read only


def test_the_algorithm_comparison_finds_nothing_on_numpy_at_one_rank():
    from mpi4py import MPI

    from ssdmpi.gpucheck.ranks import CONFIGS, compare_one

    backend.select("cpu")
    for settings in CONFIGS[:3]:
        worst, same = compare_one(MPI.COMM_SELF, np, settings, np.float64, "test", "host")
        assert worst == 0.0 and same, settings      # one rank on NumPy: the reference's very operations


def test_the_algorithm_comparison_sees_a_reference_that_drifts(monkeypatch):
    from mpi4py import MPI

    from ssdmpi.gpucheck.ranks import compare_one
    from ssdmpi.verify import reference

    class Drifting(reference.Simulation):
        def step(self):
            out = super().step()
            self.W = self.W + 1e-7
            return out

    monkeypatch.setattr(reference, "Simulation", Drifting)
    backend.select("cpu")
    worst, same = compare_one(MPI.COMM_SELF, np, {"algo": "ssgd"}, np.float64, "test", "host")
    assert worst >= 1e-7 and same


def test_the_two_rank_harness_runs_under_mpiexec_on_numpy(tmp_path):
    """``ranks algorithms`` at 2 ranks on NumPy: every case runs, and matches the reference bitwise
    (2 ranks: an MPI sum is one addition). On a GPU the same code compares CuPy with NumPy."""
    part_file = tmp_path / "alg.json"
    mpiexec = run.mpiexec()
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "ssdmpi.gpucheck.ranks", "algorithms",
                           str(part_file), "--numpy"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = json.loads(part_file.read_text())["checks"]
    from ssdmpi.algos import registry

    # one case per registered variant without parameter servers, the two --comm step cases, asgd's
    served = [v for v in registry.variants().values() if registry.ALGORITHMS[v["algo"]].takes("servers")]
    assert len(checks) == len(registry.variants()) - len(served) + 3, checks
    assert all(c["ok"] and c["value"] == 0.0 for c in checks), checks
    assert any("delta-merge" in c["name"] for c in checks)
    assert any("asgd" in c["name"] for c in checks)


def test_the_training_part_reads_the_last_step_record(tmp_path):
    from ssdmpi.gpucheck.parts import _last_step_record

    lines = [{"kind": "step", "step": 50, "loss": 1.0}, {"kind": "step", "step": 100, "loss": 0.5},
             {"kind": "eval", "step": 100, "test_acc": 0.9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    last, records = _last_step_record(str(tmp_path))
    assert last["step"] == 100 and len(records) == 3
    assert _last_step_record(os.path.join(tmp_path, "missing")) == (None, [])
