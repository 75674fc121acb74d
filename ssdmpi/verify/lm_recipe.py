"""An independent check of the language-model recipe: ``ssdmpi train --algo ssgd`` with AdamW on a gpt
against a plain single-process PyTorch run of the same recipe, written here from its description.

``python -m ssdmpi.verify.lm_recipe --preset text-gpt [--ranks 4] [--steps N] [SETTING=VALUE ...]``
runs ``ssdmpi train`` (under ``mpiexec -n RANKS``; ``--algo ssgd --log-every 1 --eval-every 0``, the
rest the preset's) and then, in this process, PyTorch on the same recipe:

- the model: ``ssdmpi/verify/torch_gpt.py``'s nanoGPT twin, with the initial weights of ssdmpi's
  model of the run's seed (float32, as ssdmpi's);
- the data: the same global batches in the same order (the union of the ranks' batches of a step is
  a one-rank loader's batch of ``ranks x batch``: ``ssdmpi/data/loader.py``), the mean cross-entropy
  over the batch's tokens;
- the optimizer: ``torch.optim.AdamW`` (its own update, not ssdmpi's) with two parameter groups,
  the tensors ssdmpi decays (the Linear weights) at ``--weight-decay`` and the rest at 0, ``--beta1``,
  ``--beta2``, ``--eps``; ``torch.nn.utils.clip_grad_norm_`` at ``--grad-clip`` (when > 0): the parts
  of ``ssdmpi/verify/torch_optim.py``, which the benchmark's PyTorch peers train with too;
- the learning rate of step ``s`` (0-based), as ``ssdmpi train --help`` states it: a linear warm-up
  of ``w = round(lr_warmup_epochs x steps per epoch)`` steps, ``lr (s + 1) / w``, then the schedule
  (``constant``, or ``cosine``: ``lr (1 + cos(pi p)) / 2``, ``p = (s - w) / (total - w)``).

It compares each step's training loss (ssdmpi's ``metrics.jsonl``, mean over the ranks) and the
validation loss of the final model on the validation windows (ssdmpi's final evaluation against
PyTorch's mean cross-entropy over the same windows): ``ok`` when the validation losses agree
within ``VAL_RTOL`` (1%) relative and the step losses within ``STEP_RTOL``. Both runs are float32:
they agree to rounding at first and drift apart slowly, as two implementations do.

Needs PyTorch (a test oracle only). ``tests/unit/test_lm_recipe.py`` runs a small case.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ssdmpi.algos import registry

VAL_RTOL = 0.01     # the final validation losses, relative
STEP_RTOL = 0.03    # every step's training loss, relative
FORCED = {"algo": registry.BASELINE, "log_every": 1, "eval_every": 0}   # what the comparison needs of the run


def mpiexec() -> str:
    """The launcher beside this Python (the venv's), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def flags(settings: dict) -> list:
    """``ssdmpi train`` flags of a settings mapping (field names, as a YAML file has them)."""
    out = []
    for name, value in settings.items():
        out += [f"--{name.replace('_', '-')}", ",".join(map(str, value)) if isinstance(value, (list, tuple))
                else str(value)]
    return out


def run_ssdmpi(preset: str | None, settings: dict, ranks: int, run_dir: str, timeout: float = 3600) -> None:
    """``ssdmpi train`` of the recipe into ``run_dir`` (``FORCED`` over ``settings`` over the preset)."""
    cmd = [sys.executable, "-m", "ssdmpi", "train", "--run-dir", run_dir, "--no-progress-bar"]
    cmd += (["--preset", preset] if preset else []) + flags({**settings, **FORCED})
    if ranks > 1:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"ssdmpi train failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")


def ssdmpi_result(run_dir: str) -> dict:
    """``{"config", "steps": {step: loss}, "val_loss", "workers", "steps_per_epoch"}`` of a finished run."""
    from ssdmpi.rundir import read_records

    records = read_records(os.path.join(run_dir, "metrics.jsonl"))
    start = next(r for r in records if r.get("kind") == "start")
    evals = [r for r in records if r.get("kind") == "eval"]
    return {"config": start["config"], "workers": int(start["workers"]),
            "steps_per_epoch": int(start["steps_per_epoch"]),
            "steps": {int(r["step"]): float(r["loss"]) for r in records if r.get("kind") == "step"},
            "val_loss": float(evals[-1]["val_loss"])}


def lr_at(cfg: dict, s: int, total: int, steps_per_epoch: int) -> float:
    """The learning rate of 0-based step ``s`` (module docstring), from the run's settings."""
    base, w = float(cfg["lr"]), int(round(float(cfg.get("lr_warmup_epochs") or 0.0) * steps_per_epoch))
    if s < w:
        return base * (s + 1) / w
    kind = cfg.get("lr_schedule") or "constant"
    if kind == "constant":
        return base
    if kind == "cosine":
        p = min(1.0, max(0.0, (s - w) / (total - w)))
        return base * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"this check knows the constant and cosine schedules, not {kind!r}")


def torch_run(cfg: dict, workers: int, threads: int | None = None) -> dict:
    """The recipe in plain PyTorch, single process (module docstring): ``{"steps": {step: loss}, "val_loss"}``."""
    import torch
    import torch.nn.functional as F

    from ssdmpi.data import load_dataset
    from ssdmpi.nn import build_model
    from ssdmpi.nn.transformer import nanogpt_name
    from ssdmpi.verify.torch_gpt import build_torch_gpt
    from ssdmpi.verify.torch_optim import adamw, clip, token_loss

    if float(cfg.get("dropout") or 0.0) > 0:
        raise ValueError("the check needs a run without dropout (the two draw different masks)")
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    data = load_dataset(cfg["dataset"], cfg.get("data_path"))
    T = int(cfg["context"])
    sizes = {k: cfg[k] for k in ("n_layer", "n_head", "d_model") if cfg.get(k) is not None}
    start = build_model(cfg["model"], (T,), data.vocab_size, seed=int(cfg["seed"]), **sizes)
    twin = build_torch_gpt(start)
    opt = adamw(twin, start, cfg["lr"], cfg["beta1"], cfg["beta2"], cfg["eps"], cfg["weight_decay"], nanogpt_name)
    loader = data.loader(T, int(cfg["batch_size"]) * workers, 0, 1, seed=int(cfg["seed"]))
    E = loader.steps_per_epoch
    total = int(cfg["steps"]) if cfg.get("steps") else int(cfg["epochs"]) * E
    losses = {}
    twin.train()
    for s in range(total):
        x, y = (torch.from_numpy(a) for a in loader.next_batch())
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, s, total, E)
        loss = token_loss(twin(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip(twin, cfg.get("grad_clip"))
        opt.step()
        losses[s + 1] = loss.detach().item()
    vx, vy = data.val_windows(T)
    twin.eval()
    total_loss = 0.0
    with torch.no_grad():
        for i in range(0, len(vx), 64):
            logits = twin(torch.from_numpy(vx[i:i + 64]))
            total_loss += float(F.cross_entropy(logits.reshape(-1, logits.size(-1)).double(),
                                                torch.from_numpy(vy[i:i + 64]).reshape(-1), reduction="sum"))
    return {"steps": losses, "val_loss": total_loss / vy.size, "steps_per_epoch": E, "total": total}


def compare(ours: dict, theirs: dict) -> dict:
    """The comparison's numbers: per-step relative loss differences, the validation losses and ``ok``."""
    steps = sorted(set(ours["steps"]) & set(theirs["steps"]))
    rel = [abs(ours["steps"][s] - theirs["steps"][s]) / abs(theirs["steps"][s]) for s in steps]
    val_rel = abs(ours["val_loss"] - theirs["val_loss"]) / abs(theirs["val_loss"])
    worst = max(range(len(rel)), key=rel.__getitem__) if rel else None
    return {"steps": len(steps), "expected_steps": len(theirs["steps"]), "first_loss": [ours["steps"].get(1),
            theirs["steps"].get(1)], "last_loss": [ours["steps"].get(steps[-1]) if steps else None,
            theirs["steps"].get(steps[-1]) if steps else None],
            "step_rel_max": max(rel, default=math.nan), "step_rel_max_at": steps[worst] if rel else None,
            "step_rel_mean": sum(rel) / len(rel) if rel else math.nan,
            "val_loss": {"ssdmpi": ours["val_loss"], "pytorch": theirs["val_loss"]}, "val_rel": val_rel,
            "ok": bool(steps) and len(steps) == len(theirs["steps"]) and val_rel <= VAL_RTOL
            and max(rel) <= STEP_RTOL}


def check(preset: str | None, settings: dict, ranks: int, run_dir: str | None = None,
          threads: int | None = None) -> dict:
    """Both runs and their comparison (``compare``'s numbers, with ``run_dir`` and each side's seconds)."""
    import time

    run_dir = run_dir or tempfile.mkdtemp(prefix="ssdmpi-lm-recipe-")
    t0 = time.monotonic()
    run_ssdmpi(preset, settings, ranks, run_dir)
    t1 = time.monotonic()
    ours = ssdmpi_result(run_dir)
    theirs = torch_run(ours["config"], ours["workers"], threads)
    if theirs["steps_per_epoch"] != ours["steps_per_epoch"]:
        raise RuntimeError(f"the runs' epochs differ: {ours['steps_per_epoch']} and {theirs['steps_per_epoch']} steps")
    return dict(compare(ours, theirs), run_dir=run_dir, ranks=ranks, ssdmpi_s=t1 - t0,
                pytorch_s=time.monotonic() - t1)


def _setting(text: str) -> tuple:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected SETTING=VALUE, got {text!r}")
    return name.replace("-", "_"), value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ssdmpi.verify.lm_recipe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="text-gpt", help="the recipe's preset (default: %(default)s)")
    parser.add_argument("--ranks", type=int, default=4, help="ranks of the ssdmpi run (default: %(default)s)")
    parser.add_argument("--steps", type=int, help="train this many steps (default: the preset's)")
    parser.add_argument("--run-dir", help="the ssdmpi run's directory (default: a new temporary one)")
    parser.add_argument("--threads", type=int, help="PyTorch's threads (default: its own choice)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("settings", nargs="*", type=_setting, metavar="SETTING=VALUE",
                        help="more ssdmpi train settings, e.g. lr=0.001")
    args = parser.parse_args(argv)
    settings = dict(args.settings, **({"steps": args.steps} if args.steps else {}))
    result = check(args.preset, settings, args.ranks, args.run_dir, args.threads)
    if args.json:
        print(json.dumps(result))
    else:
        val = result["val_loss"]
        print(f"{result['steps']} steps of --preset {args.preset} --algo {registry.BASELINE} on {args.ranks} ranks "
              f"({result['run_dir']}, {result['ssdmpi_s']:.0f} s) against PyTorch in one process "
              f"({result['pytorch_s']:.0f} s)")
        print(f"  training loss: step 1 {result['first_loss'][0]:.5f} / {result['first_loss'][1]:.5f}, last "
              f"{result['last_loss'][0]:.5f} / {result['last_loss'][1]:.5f} (ssdmpi / PyTorch); relative difference "
              f"mean {result['step_rel_mean']:.2e}, max {result['step_rel_max']:.2e} at step "
              f"{result['step_rel_max_at']} (limit {STEP_RTOL:g})")
        print(f"  validation loss: ssdmpi {val['ssdmpi']:.5f}, PyTorch {val['pytorch']:.5f}, relative difference "
              f"{result['val_rel']:.2e} (limit {VAL_RTOL:g}): {'ok' if result['ok'] else 'FAILED'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
