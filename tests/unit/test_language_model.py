"""A language model from end to end through the command line, at one rank: ``ssdmpi train`` of a small
gpt (2 blocks, d_model 32, context 16) on the built-in Devil's Dictionary, then ``ssdmpi eval``,
``ssdmpi.load_model``, ``ssdmpi generate``, ``ssdmpi export`` (into the PyTorch twin) and ``ssdmpi
plot`` on its run; and the configuration's answers to settings that do not fit a language model.

Expected values come from outside the code under test: the validation loss recomputed in NumPy
from the model's logits, the perplexity as exp of it, the token counts from the run's sizes, the
greedy continuation from a loop over ``model.forward``, the exported model's logits from PyTorch.
"""

import json
import math
import os

import numpy as np
import pytest

import ssdmpi
from ssdmpi import config
from ssdmpi.data.text import decode, encode
from ssdmpi.errors import UserError
from tests.conftest import assert_one_line_error, run_cli
from tests.text_runs import SMALL_GPT, T, cli_args, numpy_val_loss

B, STEPS = 4, 30
TINY = cli_args({**SMALL_GPT, "batch_size": B, "steps": STEPS, "optimizer": "adamw", "lr": 0.003, "algo": "ssd",
                 "warmup_steps": 10, "eval_every": 0, "checkpoint_every": 15, "log_every": 5, "seed": 2})


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """``(run directory, ssdmpi train's result)`` of the tiny run."""
    run_dir = tmp_path_factory.mktemp("lm") / "run"
    result = run_cli(["train", "--run-dir", str(run_dir)] + TINY, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, result


def records(run_dir, kind):
    with open(run_dir / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


# --- ssdmpi train ------------------------------------------------------------------------------

def test_a_text_run_reports_validation_loss_perplexity_and_tokens(lm_run):
    run_dir, result = lm_run
    out = result.stdout
    assert "devils-dictionary (345,290 train / 38,366 val tokens)" in out
    assert f"batch {B} windows of {T} tokens per rank" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("eval ")]
    assert "val loss" in line and "ppl" in line and "test acc" not in line
    assert "validation loss (global model W): final" in out and "perplexity" in out and "test accuracy" not in out
    assert "tokens/s (training only, all ranks)" in out and f"{STEPS * B * T:,} tokens trained on" in out
    steps = records(run_dir, "step")
    assert [r["step"] for r in steps] == [5, 10, 15, 20, 25, 30]
    assert all(r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * T) for r in steps)
    (final,) = records(run_dir, "eval")
    assert final["tokens"] == STEPS * B * T
    assert final["val_ppl"] == pytest.approx(math.exp(final["val_loss"]))
    model = ssdmpi.load_model(run_dir)
    assert final["val_loss"] == pytest.approx(numpy_val_loss(model), rel=1e-5)
    assert final["val_loss_local"] > 0 and 0 < final["val_acc"] < 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best"] == {"metric": "val_loss", "value": final["val_loss"], "step": STEPS}
    assert summary["tokens"] == STEPS * B * T and "test_acc" not in summary
    assert os.readlink(run_dir / "checkpoints" / "best") == f"ckpt-{STEPS:08d}"   # the lowest val_loss


def test_the_checkpoint_records_the_model_s_inputs(lm_run):
    run_dir, _ = lm_run
    manifest = json.loads((run_dir / "checkpoints" / f"ckpt-{STEPS:08d}" / "manifest.json").read_text())
    assert manifest["input_shape"] == [T] and manifest["num_classes"] == 256 and manifest["normalisation"] is None
    cfg = manifest["config"]
    assert (cfg["context"], cfg["n_layer"], cfg["n_head"], cfg["d_model"]) == (T, 2, 2, 32)


def test_a_model_that_does_not_take_the_dataset_s_kind_is_refused_in_one_line(tmp_path):
    assert_one_line_error(run_cli(["train", "--dataset", "devils-dictionary", "--model", "mlp", "--steps", "1",
                                   "--run-dir", str(tmp_path / "a")]),
                          "--model mlp takes images or feature vectors, but devils-dictionary is text")
    assert_one_line_error(run_cli(["train", "--preset", "text-gpt", "--model", "wide-mlp", "--steps", "1",
                                   "--run-dir", str(tmp_path / "b")]), "--model wide-mlp takes images")
    assert_one_line_error(run_cli(["train", "--augment", "flip", "--preset", "text-gpt", "--steps", "1",
                                   "--run-dir", str(tmp_path / "c")]), "devils-dictionary has text")
    assert not any((tmp_path / d).exists() for d in "abc")


# --- the configuration -------------------------------------------------------------------------

def resolved(flags, preset=None, config_file=None):
    return config.resolve_request(config.Request(flags=flags, preset=preset, config_file=config_file))


def test_gpt_settings_given_as_flags_for_another_model_are_refused():
    with pytest.raises(UserError, match="^--n-layer applies to --model gpt, not to mlp: drop it$"):
        resolved({"n_layer": 2})
    with pytest.raises(UserError, match="^--dropout applies to --model mlp or gpt, not to resnet20"):
        resolved({"dropout": 0.1, "model": "resnet20"})
    with pytest.raises(UserError, match="^--context is the window length of a text dataset, and digits is not one"):
        resolved({"context": 32})
    with pytest.raises(UserError, match="--dropout must be < 1"):
        resolved({"dropout": 1.0, "model": "gpt"})
    assert resolved({"dropout": 0.25}).config.dropout == 0.25          # mlp declares dropout


def test_a_preset_s_or_a_file_s_model_settings_that_do_not_apply_are_left_out_with_a_note(tmp_path):
    run = resolved({"model": "mlp", "dataset": "digits"}, preset="text-gpt")
    cfg = run.config
    assert (cfg.context, cfg.n_layer, cfg.n_head, cfg.d_model) == (None, None, None, None)
    assert run.model_note == ("left out, not used with --dataset digits: preset text-gpt: context; not used with "
                              "--model mlp: preset text-gpt: n_layer, n_head, d_model")
    assert run.model_note in run.lines()
    mine = tmp_path / "mine.yaml"
    mine.write_text("n_head: 8\n")
    run = resolved({}, config_file=str(mine))
    assert run.config.n_head is None and run.model_note == f"left out, not used with --model mlp: {mine}: n_head"
    assert resolved({"model": "mymodels:net", "n_layer": 3}).config.n_layer == 3   # its factory decides


def test_a_text_dataset_gets_the_default_context_and_a_preset_s_is_recorded():
    assert resolved({"dataset": "kjv", "model": "gpt"}).config.context == config.settings.DEFAULT_CONTEXT
    assert resolved({"dataset": "bible", "model": "gpt"}).config.context == config.settings.DEFAULT_CONTEXT  # alias
    assert resolved({}).config.context is None
    cfg = resolved({}, preset="text-gpt").config
    assert (cfg.dataset, cfg.model, cfg.context) == ("devils-dictionary", "gpt", 128)


def test_the_preset_s_model_has_one_to_three_million_parameters():
    from ssdmpi.nn import build_model

    cfg = resolved({}, preset="text-gpt").config
    model = build_model("gpt", (cfg.context,), 256, **config.settings.model_options(cfg))
    assert 1_000_000 <= model.num_params <= 3_000_000


# --- ssdmpi eval, load_model, generate --------------------------------------------------------

def test_eval_prints_the_validation_loss_and_perplexity(lm_run):
    run_dir, _ = lm_run
    (final,) = records(run_dir, "eval")
    result = run_cli(["eval", "--checkpoint", str(run_dir), "--json"])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["val_loss"] == pytest.approx(final["val_loss"], rel=1e-9)
    assert report["val_ppl"] == pytest.approx(math.exp(final["val_loss"]))
    windows = (38_366 - 1) // T
    assert report["windows"] == windows and report["tokens"] == windows * T
    text = run_cli(["eval", "--checkpoint", str(run_dir)]).stdout
    assert f"validation loss {final['val_loss']:.4f} nats/token, perplexity {math.exp(final['val_loss']):.2f}" in text


def test_load_model_takes_token_ids_and_generates_greedily_as_a_loop_over_forward(lm_run):
    run_dir, _ = lm_run
    model = ssdmpi.load_model(run_dir)
    ids = encode("The devil is a ")
    logits = model.predict_logits(ids)
    assert logits.shape == (1, len(ids), 256)
    np.testing.assert_array_equal(model.predict(ids[None]), logits.argmax(-1))
    np.testing.assert_allclose(model.predict_proba(ids).sum(-1), 1.0)
    greedy = list(ids)
    for _ in range(20):     # past the context of 16: the last 16 tokens
        greedy.append(int(model.forward(np.array([greedy[-T:]]), train=False)[0, -1].argmax()))
    assert model.generate("The devil is a ", 20, temperature=0) == decode(greedy)
    assert model.generate("The devil is a ", 20, top_k=1, seed=5) == decode(greedy)
    assert model.generate("A", 30, seed=1) == model.generate("A", 30, seed=1) != model.generate("A", 30, seed=2)
    with pytest.raises(UserError, match="token ids"):
        model.predict_logits(np.zeros((1, T + 1), dtype=np.int64))


def test_generate_prints_the_prompt_and_its_continuation(lm_run, tmp_path):
    run_dir, _ = lm_run
    model = ssdmpi.load_model(run_dir)
    result = run_cli(["generate", str(run_dir), "--prompt", "LOVE, n.", "--tokens", "40", "--seed", "7",
                      "--temperature", "0.8", "--top-k", "20"])
    assert result.returncode == 0, result.stderr
    expected = model.generate("LOVE, n.", 40, temperature=0.8, top_k=20, seed=7)
    assert result.stdout == (expected if expected.endswith("\n") else expected + "\n")
    assert result.stdout.startswith("LOVE, n.")
    assert_one_line_error(run_cli(["generate", str(run_dir), "--tokens", "-1"]), "--tokens must be an integer >= 0")
    assert_one_line_error(run_cli(["generate", str(run_dir), "--temperature", "-1"]), "--temperature must be >= 0")
    image = tmp_path / "image"
    assert run_cli(["train", "--steps", "2", "--eval-every", "0", "--run-dir", str(image)]).returncode == 0
    assert_one_line_error(run_cli(["generate", str(image)]), "which is not a language model")


# --- ssdmpi export, ssdmpi plot -------------------------------------------------------------------

def test_export_under_nanogpt_names_loads_into_the_pytorch_twin_with_the_same_logits(lm_run, tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch (the test oracle) is not installed")
    pytest.importorskip("safetensors", reason="ssdmpi export needs safetensors")
    from safetensors import safe_open
    from safetensors.torch import load_model

    from ssdmpi.verify import torch_gpt

    run_dir, _ = lm_run
    out = tmp_path / "gpt.safetensors"
    result = run_cli(["export", str(run_dir), "--out", str(out)])
    assert result.returncode == 0, result.stderr
    with safe_open(str(out), "np") as f:
        meta, names = f.metadata(), set(f.keys())
    assert meta["names"] == "pytorch" and meta["num_classes"] == "256" and json.loads(meta["input_shape"]) == [T]
    assert json.loads(meta["model_options"]) == {"n_layer": 2, "n_head": 2, "d_model": 32}
    assert json.loads(meta["tied"]) == {"lm_head.weight": "transformer.wte.weight"}
    model = ssdmpi.load_model(run_dir)
    twin = torch_gpt.modules().GPT(torch_gpt.config_of(model))
    assert names == set(twin.state_dict()) - {"lm_head.weight"}
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    missing, unexpected = load_model(twin, str(out))
    assert not missing and not unexpected
    x = np.random.default_rng(0).integers(0, 256, (3, T))
    with torch.no_grad():
        theirs = twin.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model.predict_logits(x), theirs, rtol=1e-4, atol=1e-4 * np.abs(theirs).max())


def test_plot_draws_the_validation_loss_against_time_and_tokens(lm_run, tmp_path):
    pytest.importorskip("matplotlib", reason="ssdmpi plot needs matplotlib")
    from ssdmpi import plot
    from ssdmpi.rundir import load_run

    run_dir, _ = lm_run
    result = run_cli(["plot", str(run_dir), "--out", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    drawn = sorted(p.name for p in tmp_path.iterdir())
    assert {"val_loss_vs_time.png", "val_loss_vs_tokens.png", "loss.png"} <= set(drawn)
    assert not [name for name in drawn if name.startswith("accuracy")]
    (final,) = records(run_dir, "eval")
    plt = plot._pyplot()
    fig = plot._val_loss_figure(plt, [load_run(run_dir)], "tokens", "tokens", "t")
    w, local = fig.axes[0].get_lines()[:2]
    assert list(w.get_xdata()) == [final["tokens"]] and list(w.get_ydata()) == [final["val_loss"]]
    assert list(local.get_ydata()) == [final["val_loss_local"]]
    plt.close(fig)
