"""``ssdmpi bench accuracy --models gpt``: a language model on a text dataset, on tiny settings (a gpt of one
block, d_model 16, context 16, on the built-in Devil's Dictionary, a few dozen iterations).

What is checked: ssgd at one worker gives the validation loss ``ssdmpi train`` reports for the same recipe; a
delay-stage row's loss, perplexity and next-token accuracy are those of the reference simulator's ``W`` after
finalize, recomputed here in float64 from the model's logits; the table's bracket is the loss relative to
ssgd's of the same seed, in percent; ``--warmup-steps 25%`` is a quarter of the run's iterations;
``--val-windows`` scores on that many windows; a results.csv written before the language-model fields resumes;
bad flags are one-line errors (exit 2).
"""

import csv
import math

import numpy as np
import pytest

from ssdmpi.bench.accuracy import configs
from ssdmpi.bench.accuracy import simulate as accuracy_simulate
from tests.conftest import run_cli
from tests.unit.test_bench_accuracy import read_csv

GPT = "n_layer=1,n_head=2,d_model=16,context=16"
T, B, LR = 16, 4, 0.003
# devils-dictionary: 345,290 train tokens, windows of T + 1 = 17 -> 20,310 windows an epoch
WINDOWS = (345_290 + 1) // (T + 1) - 1
TINY = ["--models", "gpt", "--gpt", GPT, "--batch-size", str(B), "--optimizer", "adamw", "--lr", str(LR),
        "--epochs", "0.04", "--warmup-steps", "25%", "--delays", "3"]


def bench(args, timeout=120):
    return run_cli(["bench", "accuracy"] + list(args), timeout=timeout)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """ssgd and delta-merge (k = 3) at 1 and 2 workers, seeds 0 and 1, every validation window."""
    out = tmp_path_factory.mktemp("lm") / "sweep"
    proc = bench(TINY + ["--ranks", "1,2", "--variants", "ssgd,period/delta-merge", "--seed", "0,1",
                         "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(out / "results.csv")
    return out, proc, {(int(r["N"]), r["variant"], int(r["seed"])): r for r in rows}


def test_rows_record_the_language_model_and_its_figures(sweep):
    _, _, rows = sweep
    assert len(rows) == 2 * 2 * 2                                    # seeds x N x variants
    for (n, _, _), r in rows.items():
        assert (r["model"], r["dataset"], r["gpt"], r["val_windows"]) == ("gpt", "devils-dictionary", GPT, "0")
        assert int(r["steps"]) == round(0.04 * (WINDOWS // (B * n)))
        assert r["warmup_steps"] == "25%"
        assert 0 < float(r["val_loss"]) < 6 and 0 <= float(r["acc_W"]) <= 100
        assert float(r["val_ppl"]) == pytest.approx(math.exp(float(r["val_loss"])), rel=1e-4)


def test_ssgd_at_one_worker_is_what_ssdmpi_train_reports(sweep, tmp_path):
    """The same recipe through the trainer (its own model builder, text loader, AdamW and evaluation of the
    validation windows) ends at the validation loss of the bench's row."""
    from ssdmpi.rundir import load_run

    _, _, rows = sweep
    row = rows[(1, "ssgd", 0)]
    run_dir = tmp_path / "run"
    proc = run_cli(["train", "--dataset", "devils-dictionary", "--model", "gpt", "--n-layer", "1", "--n-head", "2",
                    "--d-model", "16", "--context", str(T), "--batch-size", str(B), "--steps", row["steps"],
                    "--optimizer", "adamw", "--lr", str(LR), "--algo", "ssgd", "--seed", "0", "--eval-every", "0",
                    "--no-progress-bar", "--run-dir", str(run_dir)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trained = load_run(run_dir).final_val_loss()
    assert float(row["val_loss"]) == pytest.approx(trained, abs=1e-5)            # the row keeps 5 decimals
    # and that is not a figure every short run ends near: the other seed's ends elsewhere
    assert abs(float(rows[(1, "ssgd", 1)]["val_loss"]) - trained) > 1e-3


def _float64_scores(model, x, y):
    """``(loss per token, next-token accuracy)`` of the model on windows ``(x, y)``, from its logits in float64."""
    loss, correct = 0.0, 0
    for i in range(0, len(x), 256):
        z = model.forward(x[i:i + 256], train=False).astype(np.float64)
        z -= z.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        loss -= np.take_along_axis(logp, y[i:i + 256, :, None], axis=-1).sum()
        correct += int((z.argmax(axis=-1) == y[i:i + 256]).sum())
    return loss / y.size, correct / y.size


def _simulated_W(variant, k, n, seed, steps, warmup):
    """The reference simulator's ``W`` after ``finalize``, built here from the dataset and the model registry."""
    from ssdmpi.algos import AlgoConfig
    from ssdmpi.data import load_dataset
    from ssdmpi.nn import build_model
    from ssdmpi.verify.reference import simulate

    ds = load_dataset("devils-dictionary")
    cfg = AlgoConfig(lr=LR, optimizer="adamw", weight_decay=0.1, warmup_steps=warmup, **configs.variant_settings(
        variant, k))

    def factory():
        return build_model("gpt", (T,), 256, seed=seed, n_layer=1, n_head=2, d_model=16)

    loaders = [ds.loader(T, B, r, n, seed) for r in range(n)]
    sim = simulate(cfg, factory, loaders, steps)
    sim.finalize()
    model = factory()
    model.params[...] = sim.W
    return model, ds


def test_a_delay_stage_row_is_the_validation_loss_of_the_simulated_W_after_finalize(sweep):
    _, _, rows = sweep
    row = rows[(2, "period/delta-merge", 1)]
    steps = int(row["steps"])
    warmup = round(steps / 4)
    assert (steps - warmup) % 3 != 0                              # the end falls mid-period: finalize matters
    model, ds = _simulated_W("period/delta-merge", 3, 2, 1, steps, warmup)
    loss, acc = _float64_scores(model, *ds.val_windows(T))
    assert float(row["val_loss"]) == pytest.approx(loss, abs=2e-5)
    assert float(row["acc_W"]) == pytest.approx(100 * acc, abs=0.006)
    assert float(row["val_loss_noflush"]) != float(row["val_loss"])


def test_the_table_gives_the_loss_relative_to_ssgd_of_the_same_seed_in_percent(sweep):
    import json

    out, proc, rows = sweep
    loss = {key: float(r["val_loss"]) for key, r in rows.items()}
    rel = [100 * (loss[(2, "period/delta-merge", s)] - loss[(2, "ssgd", s)]) / loss[(2, "ssgd", s)] for s in (0, 1)]
    runs = [loss[(2, "period/delta-merge", s)] for s in (0, 1)]
    ssgd = [loss[(2, "ssgd", s)] for s in (0, 1)]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("| gpt | 0.003 | 2 |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:] == [f"{sum(ssgd) / 2:.4f} [+0.00%] ({min(ssgd):.4f}..{max(ssgd):.4f})",
                         f"{sum(runs) / 2:.4f} [{sum(rel) / 2:+.2f}%] ({min(runs):.4f}..{max(runs):.4f})"]
    assert "validation loss (nats per token, lower is better)" in proc.stdout
    data = json.loads((out / "result.json").read_text())
    by_key = {(r["N"], r["variant"], r["seed"]): r for r in data["rows"]}
    for s in (0, 1):
        assert by_key[(2, "period/delta-merge", s)]["val_loss_vs_ssgd_pct"] == pytest.approx(rel[s], abs=6e-4)
        assert by_key[(2, "ssgd", s)]["val_loss_vs_ssgd_pct"] == 0


def _cfg(**more):
    return {**dict(model="gpt", N=2, variant="period/delta-merge", k=3, dataset="devils-dictionary", lr=LR,
                   batch_size=B, epochs=0.04, warmup_steps="25%", optimizer="adamw", momentum="", weight_decay=0.1,
                   train_subset=0, seed=0, tail=0, gpt=GPT, val_windows=0), **more}


def test_a_warm_up_percentage_is_that_share_of_the_run_s_iterations():
    by_share = accuracy_simulate.run_config(_cfg())
    warmup = round(int(by_share["steps"]) / 4)
    assert configs.warmup_iterations("25%", int(by_share["steps"])) == warmup
    assert accuracy_simulate.run_config(_cfg(warmup_steps=warmup))["val_loss"] == by_share["val_loss"]
    assert accuracy_simulate.run_config(_cfg(warmup_steps=warmup + 3))["val_loss"] != by_share["val_loss"]


def test_val_windows_scores_on_that_many_windows_evenly_spread():
    row = accuracy_simulate.run_config(_cfg(val_windows=50))
    model, ds = _simulated_W("period/delta-merge", 3, 2, 0, int(row["steps"]), round(int(row["steps"]) / 4))
    x, y = ds.val_windows(T)
    chosen = np.arange(50) * len(x) // 50
    loss, _ = _float64_scores(model, x[chosen], y[chosen])
    assert float(row["val_loss"]) == pytest.approx(loss, abs=2e-5)
    assert float(row["val_loss"]) != pytest.approx(_float64_scores(model, x, y)[0], abs=1e-3)


def test_a_results_file_written_before_the_language_model_fields_resumes(tmp_path):
    """An image sweep's results.csv without the fields added for language models: resumed, its rows count as
    done (not run again) and the file is rewritten with every field, theirs blank."""
    out = tmp_path / "old"
    args = ["--dataset", "digits", "--models", "mlp", "--ranks", "2", "--delays", "2", "--epochs", "0.2",
            "--warmup-steps", "4", "--batch-size", "8", "--lr", "0.05", "--variants", "ssgd,localsgd"]
    assert bench(args + ["--out", str(out)]).returncode == 0
    rows = read_csv(out / "results.csv")
    added = ("gpt", "val_windows", "val_loss", "val_loss_noflush", "val_loss_tail", "val_ppl")
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[f for f in configs.FIELDS if f not in added], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    again = bench(args + ["--out", str(out), "--resume"])
    assert again.returncode == 0, again.stderr
    assert "resume: 2 configuration(s)" in again.stderr and "[1/" not in again.stderr
    upgraded = read_csv(out / "results.csv")
    assert list(upgraded[0]) == list(configs.FIELDS)
    assert [(r["acc_W"], r["gpt"], r["val_windows"], r["val_loss"]) for r in upgraded] == \
        [(r["acc_W"], "", "0", "") for r in rows]


@pytest.mark.parametrize("args, words", [
    (["--models", "gpt,mlp"], "--models: gpt train on text, mlp on images: run them in separate commands"),
    (["--models", "gpt", "--dataset", "digits"], "--dataset digits holds images or feature vectors"),
    (["--models", "mlp", "--dataset", "kjv"], "--dataset kjv holds text"),
    (["--models", "gpt", "--gpt", "n_block=2"], "--gpt: unknown size 'n_block'"),
    (["--models", "gpt", "--gpt", "n_layer=0"], "--gpt: n_layer must be a positive integer, got 0"),
    (["--models", "gpt", "--gpt", "d_model=x"], "--gpt: d_model must be a positive integer, got 'x'"),
    (["--models", "gpt", "--gpt", "n_head=3,d_model=16"], "d_model 16 must be a multiple of n_head 3"),
    (["--models", "gpt", "--gpt", "context=40000"], "--gpt context=40000: the validation split"),
    (["--models", "gpt", "--val-windows", "0"], "--val-windows must be >= 1"),
    (["--models", "mlp", "--val-windows", "10"], "--val-windows applies to a language model"),
    (["--models", "mlp", "--gpt", "n_layer=1"], "--gpt applies to a language model"),
    (["--models", "gpt", "--train-subset", "100"], "--train-subset applies to an image model"),
    (["--models", "gpt", "--warmup-steps", "100%"], "--warmup-steps must be >= 0 (and a percentage below 100%)"),
    (["--models", "gpt", "--warmup-steps", "a"], "--warmup-steps must be iterations (an integer) or a percentage"),
])
def test_bad_flags_are_one_line_errors(args, words):
    proc = bench(args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert proc.stdout == ""
