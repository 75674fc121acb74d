"""``--resume auto`` after the newest checkpoint turned out corrupt: the run resumes from the one
before it for as long as the run was last asked to train (its ``config.yaml``), not for as long
as that older checkpoint's own config says, so the lost epoch is trained again."""

import json

import h5py

from tests.conftest import run_cli

SMALL = ["--dataset", "digits", "--model", "mlp", "--widths", "16", "--batch-size", "32", "--algo", "ssd",
         "--delay", "2", "--warmup-steps", "4", "--no-progress-bar"]
E = 1437 // (32 * 2)      # steps per epoch on 2 ranks


def records(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_a_corrupt_newest_checkpoint_is_trained_again_for_the_length_asked(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli(["train", "--run-dir", str(run_dir), "--epochs", "1"] + SMALL, ranks=2)
    assert first.returncode == 0, first.stderr
    longer = run_cli(["train", "--run-dir", str(run_dir), "--resume", "auto", "--epochs", "2"] + SMALL, ranks=2)
    assert longer.returncode == 0, longer.stderr
    newest = run_dir / "checkpoints" / f"ckpt-{2 * E:08d}"
    with h5py.File(newest / "rank-0000.h5", "r+") as f:    # one changed number: its checksum no longer verifies
        weights = f["shared/algo/W"]
        weights[0] = weights[0] + 1

    again = run_cli(["train", "--run-dir", str(run_dir), "--resume", "auto"] + SMALL, ranks=2)
    assert again.returncode == 0, again.stderr
    out = again.stdout + again.stderr
    assert f"skipping corrupt checkpoint {newest}" in out
    assert "is complete" not in out, out
    start = records(run_dir, "start")[-1]
    assert start["resumed_from"].endswith(f"ckpt-{E:08d}") and start["step"] == E and start["total_steps"] == 2 * E
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 2 * E and summary["epoch"] == 2 and summary["config"]["epochs"] == 2
    # The retrained checkpoint replaced the corrupt one, and verifies.
    assert run_cli(["ckpt", "verify", str(newest)]).returncode == 0
    # Flags still win over config.yaml: asked for 1 epoch, the run is complete at 2.
    shorter = run_cli(["train", "--run-dir", str(run_dir), "--resume", "auto", "--epochs", "1"] + SMALL, ranks=2)
    assert shorter.returncode == 0 and "is complete" in shorter.stdout, shorter.stdout + shorter.stderr
