"""A language model trained on a text dataset, on real MPI ranks (tests/run.py: 1, 2 and 4 ranks).

Each case is a short run of a small gpt (2 blocks, d_model 32, context 16) on the built-in
Devil's Dictionary, run by every rank in-process: one per algorithm family and optimizer. The
ranks agree on the trained global model bit for bit and on the summary; the validation loss the run
reports is the mean cross-entropy over every validation token, recomputed here in NumPy from the
trained model's logits on one process (the run evaluates its shards on every rank). A run stopped
at half its steps (mid-epoch) and resumed ends bitwise as the uninterrupted one, every saved field.
"""

import hashlib
import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import ssdmpi
from ssdmpi.cli import main
from ssdmpi.errors import REQUEUE_EXIT
from tests.checkpoints import differences, fields
from tests.mpi.test_resume import newest_checkpoint, shared_tmpdir
from tests.text_runs import SMALL_GPT, T, cli_args, numpy_val_loss

WORLD = MPI.COMM_WORLD
B, STEPS, WARMUP, K = 4, 24, 8, 4
SMALL = {**SMALL_GPT, "batch_size": B, "steps": STEPS, "seed": 3, "eval_every": 0, "log_every": 6,
         "progress_bar": False}
ADAMW = {"optimizer": "adamw", "lr": 0.003}
CASES = {
    "ssgd-adamw": {"algo": "ssgd", **ADAMW},
    "ssd-period-adamw": {"algo": "ssd", "comm": "period", "delay": K, "warmup_steps": WARMUP, **ADAMW},
    "ssd-period-delta-own": {"algo": "ssd", "comm": "period", "period_rule": "delta-own", "delay": K,
                             "warmup_steps": WARMUP, "lr": 0.1},
    "ssd-step-sgd": {"algo": "ssd", "comm": "step", "delay": K, "warmup_steps": WARMUP, "lr": 0.1},
    "odsgd": {"algo": "odsgd", "warmup_steps": WARMUP, "lr": 0.1},
    "localsgd-adamw": {"algo": "localsgd", "delay": K, "warmup_steps": WARMUP, **ADAMW},
}


def digest(array) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_a_text_run_trains_and_every_rank_agrees(case):
    run_dir = os.path.join(shared_tmpdir(), case)
    result = ssdmpi.train({**SMALL, **CASES[case], "run_dir": run_dir})
    assert result.exit_code == 0
    summary = result.summary
    mine = (digest(result.model.params), summary["val_loss"], summary["tokens"])
    assert WORLD.allgather(mine) == [mine] * WORLD.Get_size()
    assert summary["tokens"] == STEPS * B * WORLD.Get_size() * T
    assert summary["best"]["metric"] == "val_loss" and "test_acc" not in summary
    # the run's sharded evaluation against one process's, from the logits
    assert summary["val_loss"] == pytest.approx(numpy_val_loss(result.model), rel=1e-5)
    assert summary["val_loss"] < np.log(256) - 0.2          # it learned something in 24 steps
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * T)
    if WORLD.Get_rank() == 0:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        (final,) = [r for r in records if r["kind"] == "eval"]
        assert final["val_ppl"] == pytest.approx(np.exp(final["val_loss"])) and 0 < final["val_acc"] < 1
        steps = [r for r in records if r["kind"] == "step"]
        assert [r["step"] for r in steps] == [6, 12, 18, 24]
        assert all(r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * T) for r in steps)


RESUME = {"ssgd-adamw": CASES["ssgd-adamw"], "ssd-period-adamw": CASES["ssd-period-adamw"],
          "localsgd-adamw": CASES["localsgd-adamw"], "ssd-step-sgd": CASES["ssd-step-sgd"]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(RESUME))
def test_a_text_run_stopped_mid_epoch_and_resumed_is_bitwise_the_uninterrupted_one(case):
    args = cli_args({**SMALL, **RESUME[case], "lr_schedule": "cosine", "keep_checkpoints": 0})
    tmp = shared_tmpdir()
    straight, split = os.path.join(tmp, "straight"), os.path.join(tmp, "split")
    size = WORLD.Get_size()
    assert WORLD.allgather(main(["train", "--run-dir", straight] + args)) == [0] * size
    assert WORLD.allgather(main(["train", "--run-dir", split, "--stop-at-step", str(STEPS // 2)] + args)) \
        == [REQUEUE_EXIT] * size
    assert WORLD.allgather(main(["train", "--run-dir", split, "--resume", "auto"] + args)) == [0] * size
    result = None
    if WORLD.Get_rank() == 0:
        a = os.path.join(straight, "checkpoints", newest_checkpoint(straight))
        b = os.path.join(split, "checkpoints", newest_checkpoint(split))
        A, B_ = fields(a), fields(b)
        result = (os.path.basename(a), os.path.basename(b), differences(A, B_), sorted(A))
    first, second, diff, compared = WORLD.bcast(result, root=0)
    assert first == second == f"ckpt-{STEPS:08d}"
    assert diff == [], f"not bitwise identical after resume: {diff}"
    last = f"rank_{size - 1:04d}"
    assert {"shared/algo/W", f"{last}/algo/t", f"{last}/loader/sample_offset", f"{last}/loader/epoch"} <= set(compared)
