"""The language-model recipe against an independent PyTorch run (``ssdmpi/verify/lm_recipe.py``): ssgd
with AdamW (weight decay on the Linear weights only, gradient clipping) under a linear lr warm-up
and a cosine decay, 40 steps of a small gpt on the built-in corpus on 2 ranks, against torch's own
AdamW on the nanoGPT twin in one process with the same initial weights and the same global batches.
Skipped without PyTorch (a test oracle only)."""

import math

import pytest

pytest.importorskip("torch", reason="PyTorch (the oracle of this check) is not installed")

from ssdmpi.verify import lm_recipe  # noqa: E402

SMALL = {"n_layer": 2, "n_head": 2, "d_model": 32, "context": 16, "batch_size": 4, "steps": 40,
         "lr_warmup_epochs": 0.004}    # 2,538 steps per epoch at 2 x 4 windows: 10 steps of warm-up


@pytest.mark.timeout(300)
def test_ssgd_adamw_on_gpt_matches_a_plain_pytorch_run_of_the_same_recipe(tmp_path):
    result = lm_recipe.check("text-gpt", SMALL, ranks=2, run_dir=str(tmp_path / "run"), threads=1)
    assert result["steps"] == result["expected_steps"] == 40
    assert result["first_loss"][0] == pytest.approx(math.log(256), rel=0.02)     # a fresh model: uniform
    assert result["val_rel"] <= lm_recipe.VAL_RTOL and result["step_rel_max"] <= lm_recipe.STEP_RTOL
    assert result["step_rel_max"] < 1e-4          # float32 both ways: rounding, not another recipe
    assert result["last_loss"][1] < result["first_loss"][1] - 1.0       # and it trained
    assert result["ok"]


def test_the_lr_schedule_is_the_documented_warm_up_then_cosine():
    cfg = {"lr": 0.5, "lr_warmup_epochs": 0.5, "lr_schedule": "cosine"}
    E, total = 8, 20          # warm-up: 4 steps
    assert [lm_recipe.lr_at(cfg, s, total, E) for s in range(4)] == [0.125, 0.25, 0.375, 0.5]
    assert lm_recipe.lr_at(cfg, 4, total, E) == 0.5
    assert lm_recipe.lr_at(cfg, 12, total, E) == pytest.approx(0.25)       # halfway through the decay
    assert lm_recipe.lr_at(cfg, 20, total, E) == pytest.approx(0.0)


def test_a_different_recipe_is_caught():
    """The comparison itself: a run 2% off in its validation loss is not ok."""
    ours = {"steps": {1: 5.5, 2: 5.0}, "val_loss": 2.04}
    theirs = {"steps": {1: 5.5, 2: 5.0}, "val_loss": 2.0}
    assert not lm_recipe.compare(ours, theirs)["ok"]
    assert lm_recipe.compare(dict(ours, val_loss=2.01), theirs)["ok"]
    assert not lm_recipe.compare(dict(ours, steps={1: 5.5}), theirs)["ok"]        # a step missing
