"""The PyTorch DDP peer of ``ssdmpi bench peers`` on the language model (ssdmpi/bench/torch_peer.py):
from the same flags (``--preset text-gpt``: AdamW, gradient clipping, a linear lr warm-up and a cosine
decay) it trains what ``ssdmpi train --algo ssgd`` trains.

The oracle is ssdmpi's own run of the same recipe, independent code: NumPy's gpt, ssdmpi's AdamW and
clipping, MPI's allreduce, against PyTorch's nanoGPT twin, ``torch.optim.AdamW``,
``clip_grad_norm_`` and gloo. Both are float32, so they agree to rounding at first and drift apart
slowly: over these 20 steps every step's training loss within ``STEP_RTOL`` (1e-5) relative and the
final validation loss within ``VAL_RTOL`` (1e-5), a hundred times the differences seen at 1 and 2
ranks (about 1e-7 per step, the validation losses equal to 1e-6). tests/mpi/test_peers.py checks the
weights step by step in float64. Then ``bench peers --preset text-gpt`` end to end, and its DDP
columns from synthetic rows. Skipped with the reason when PyTorch is missing.
"""

import csv
import io
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, mpiexec, run_cli
from tests.text_runs import SMALL_GPT, cli_args

STEP_RTOL = 1e-5      # every step's training loss, relative
VAL_RTOL = 1e-5       # the final validation loss, relative
STEPS = 20
GLOBAL_BATCH = 8      # windows per step over all ranks: the same steps per epoch at 1 and 2 ranks


def recipe(ranks: int) -> list:
    """``ssdmpi train`` flags of the short run: the preset's recipe on the small gpt, a 10-step lr warm-up
    (0.004 of 2,538 steps per epoch) then the cosine decay to step 20, every step logged, one evaluation
    at the end."""
    settings = dict(SMALL_GPT, algo="ssgd", batch_size=GLOBAL_BATCH // ranks, steps=STEPS, lr_warmup_epochs=0.004,
                    log_every=1, eval_every=0, progress_bar=False)
    return ["--preset", "text-gpt", *cli_args(settings)]


def launch(module_args: list, ranks: int, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", *module_args]
    if ranks > 1:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_the_recipe_clips_from_the_first_step():
    """The run below exercises the clipping: the first batch's gradient norm is above the preset's
    ``--grad-clip`` 1.0 (PyTorch's own norm of the twin's gradient)."""
    torch = pytest.importorskip("torch", reason="the PyTorch peers need PyTorch (pip install torch)")
    from ssdmpi.config.files import load_preset
    from ssdmpi.data import load_dataset
    from ssdmpi.nn import build_model
    from ssdmpi.verify.torch_gpt import build_torch_gpt
    from ssdmpi.verify.torch_optim import token_loss

    data = load_dataset("devils-dictionary")
    sizes = {k: SMALL_GPT[k] for k in ("n_layer", "n_head", "d_model")}
    twin = build_torch_gpt(build_model("gpt", *data.model_inputs(SMALL_GPT["context"]), seed=0, **sizes))
    x, y = data.loader(SMALL_GPT["context"], GLOBAL_BATCH, 0, 1, seed=0).next_batch()
    token_loss(twin(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    norm = float(torch.nn.utils.clip_grad_norm_(twin.parameters(), float("inf")))
    assert norm > load_preset("text-gpt")["grad_clip"] == 1.0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_ddp_peer_trains_the_language_model_as_ssdmpi_ssgd_does(tmp_path, ranks):
    pytest.importorskip("torch", reason="the PyTorch peers need PyTorch (pip install torch)")
    from ssdmpi.rundir import load_run

    flags = recipe(ranks)
    ours = launch(["ssdmpi", "train", "--run-dir", str(tmp_path / "ssgd"), *flags], ranks)
    assert ours.returncode == 0, ours.stdout[-2000:] + ours.stderr[-2000:]
    peer = launch(["ssdmpi.bench.torch_peer", "--peer", "ddp", "--run-dir", str(tmp_path / "ddp"), *flags], ranks)
    assert peer.returncode == 0, peer.stdout[-2000:] + peer.stderr[-2000:]
    a, b = load_run(tmp_path / "ssgd"), load_run(tmp_path / "ddp")
    mine = {int(r["step"]): r for r in b.steps}
    theirs = {int(r["step"]): r for r in a.steps}
    assert sorted(mine) == sorted(theirs) == list(range(1, STEPS + 1))
    for step, r in theirs.items():
        assert mine[step]["loss"] == pytest.approx(r["loss"], rel=STEP_RTOL), f"step {step}"
        assert mine[step]["lr"] == pytest.approx(r["lr"], rel=1e-12, abs=1e-15), f"lr after step {step}"
        assert mine[step]["tokens_per_s"] == pytest.approx(mine[step]["samples_per_s"] * SMALL_GPT["context"])
    assert theirs[STEPS]["loss"] < theirs[1]["loss"] - 1.0             # it trained
    assert b.final_val_loss() == pytest.approx(a.final_val_loss(), rel=VAL_RTOL)
    final = b.evals[-1]
    assert final["val_ppl"] == pytest.approx(2.718281828459045 ** final["val_loss"])
    assert final["tokens"] == STEPS * GLOBAL_BATCH * SMALL_GPT["context"]
    config = b.summary["config"]
    assert (config["optimizer"], config["grad_clip"], config["lr_warmup_steps"], config["context"]) == \
        ("adamw", 1.0, 10, SMALL_GPT["context"])
    assert b.summary["tokens_per_s"] > 0 and b.summary["val_loss"] == final["val_loss"]


@pytest.mark.timeout(900)
def test_bench_peers_on_the_language_model_end_to_end(tmp_path):
    """``bench peers --preset text-gpt``: ssgd and DDP side by side in tokens/s and validation loss; they
    train the same thing, so their losses agree and DDP's ratios to itself are 1."""
    pytest.importorskip("torch", reason="the PyTorch peers need PyTorch (pip install torch)")
    out = tmp_path / "b"
    small = "--n-layer 1 --n-head 2 --d-model 32 --context 32 --lr-warmup-epochs 0 --log-every 2"
    result = run_cli(["bench", "peers", "--preset", "text-gpt", "--variants", "ssgd,ddp", "--steps", "4",
                      "--batch-size", "4", "--net", "none", "--out", str(out), "--train-args", small], timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    md = (out / "results.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| variant |"))
    for column in ("tokens/s", "tokens/s / DDP's", "final val loss", "val loss vs DDP %", "val loss vs ssgd %"):
        assert f"| {column} |" in header, header
    assert "samples/s" not in header and "test acc" not in header
    rows = {r["name"]: r for r in json.loads((out / "result.json").read_text())["rows"]}
    assert set(rows) == {"ssgd", "ddp"} and all(r["status"] == "ok" for r in rows.values())
    assert rows["ddp"]["x_ddp"] == 1.0 and rows["ddp"]["loss_vs_ddp"] == 0.0
    assert rows["ssgd"]["tokens_per_s"] > 0 and rows["ssgd"]["x_ddp"] > 0
    assert rows["ssgd"]["final_loss"] == pytest.approx(rows["ddp"]["final_loss"], rel=VAL_RTOL)
    assert abs(rows["ssgd"]["loss_vs_ddp"]) <= 100 * VAL_RTOL
    table = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    assert {"tokens_per_s", "final_loss", "loss_vs_ddp"} <= set(table[0])


def test_the_ddp_columns_of_a_language_models_rows():
    """``compare_to_ddp`` on a language model's rows (no PyTorch needed): tokens/s over DDP's and the
    validation loss in percent of DDP's; the first table's headers say so."""
    from ssdmpi.bench.peers import compare_to_ddp, parse_peer_variant, peer_columns

    variants = [parse_peer_variant(v) for v in ("ddp", "ssgd", "ssd")]
    rows = [{"name": "ddp", "samples_per_s": 10.0, "tokens_per_s": 1280.0, "final_loss": 2.0, "tta_s": 8.0},
            {"name": "ssgd", "samples_per_s": 12.0, "tokens_per_s": 1536.0, "final_loss": 2.0, "tta_s": 6.0},
            {"name": "ssd", "samples_per_s": 30.0, "tokens_per_s": 3840.0, "final_loss": 2.05, "tta_s": 2.0}]
    compare_to_ddp(rows, variants)
    assert [r["x_ddp"] for r in rows] == [1.0, 1.2, 3.0]
    assert [r["loss_vs_ddp"] for r in rows] == pytest.approx([0.0, 0.0, 2.5])
    assert [r["tta_x_ddp"] for r in rows] == [1.0, 0.75, 0.25]
    assert all("acc_vs_ddp" not in r for r in rows)
    headers = dict(peer_columns(rows))
    assert headers["tokens_per_s"] == "tokens/s" and headers["x_ddp"] == "tokens/s / DDP's"
    assert headers["loss_vs_ddp"] == "val loss vs DDP %" and "acc_vs_ddp" not in headers
    image = [{"name": "ddp", "samples_per_s": 10.0, "final_acc": 85.0}]
    assert dict(peer_columns(image))["x_ddp"] == "samples/s / DDP's"
