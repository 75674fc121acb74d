"""The one-process parts of the GPU check: ``python -m ssdmpi.gpucheck.parts PART FILE [--work DIR]``.

- ``models``: NumPy vs CuPy forward and backward of mlp, lenet5 and resnet20 in float32 and
  float64, from the same initial weights and batch (norm-wise relative differences: float32
  ReLU kinks may flip single activations between backends); the loss stays on the device.
- ``optimizers``: every fused update (``ssdmpi/optim/fused.py``; CuPy kernels compiled with
  ``--fmad=false``) on CuPy against its NumPy loop: the same bits are expected.
- ``engine``: one training step (forward, backward, SGD) of ssdmpi on CuPy vs the same model in
  PyTorch on CUDA, medians of interleaved steps; goal <= 3x for resnet20 at batch 128.
- ``training``: short ``ssdmpi train --device gpu`` runs of ssgd and ssd at 2 ranks sharing
  the GPU (it starts mpiexec itself): both learn, and the per-step breakdown of the ssd run.

Each part records its checks in ``FILE`` as it goes (``PartLog``); the runner gives it a time budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from ssdmpi import backend
from ssdmpi.algos import registry
from ssdmpi.gpucheck.report import PartLog

MODEL_CASES = (("mlp", (1, 28, 28), {"widths": (64, 32)}), ("lenet5", (1, 28, 28), {}),
               ("resnet20", (3, 32, 32), {}))
TOLERANCE = {np.float32: 2e-3, np.float64: 1e-9}   # as tests/unit/test_gpu_nn.py


def rel(a, b) -> float:
    """Norm-wise relative difference of ``a`` from the reference ``b`` (host arrays)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def models(log: PartLog, cupy) -> None:
    from ssdmpi.nn import build_model

    for name, shape, options in MODEL_CASES:
        for dtype in (np.float32, np.float64):
            tol, tag = TOLERANCE[dtype], f"{name} {np.dtype(dtype).name}"
            cpu = build_model(name, shape, 10, xp=np, dtype=dtype, seed=3, **options)
            gpu = build_model(name, shape, 10, xp=cupy, dtype=dtype, seed=3, **options)
            rng = np.random.default_rng(0)
            x = rng.normal(size=(16,) + shape).astype(dtype)
            labels = rng.integers(0, 10, size=16)
            loss_c = cpu.loss_and_grad(x, labels)
            loss_g = gpu.loss_and_grad(cupy.asarray(x), cupy.asarray(labels))
            log.check(f"{tag}: the loss stays on the device", backend.is_device_array(loss_g),
                      detail=type(loss_g).__name__)
            log.check(f"{tag}: loss", abs(float(loss_g) - loss_c) <= tol * max(1.0, abs(loss_c)),
                      value=abs(float(loss_g) - loss_c), goal=f"<= {tol:g} (abs, scaled)")
            log.check(f"{tag}: gradient", rel(backend.to_host(gpu.grads), cpu.grads) <= 10 * tol,
                      value=rel(backend.to_host(gpu.grads), cpu.grads), goal=f"<= {10 * tol:g} (rel, norm)")
            logits_c = cpu.forward(x, train=False)
            logits_g = backend.to_host(gpu.forward(cupy.asarray(x), train=False))
            log.check(f"{tag}: inference forward", rel(logits_g, logits_c) <= tol,
                      value=rel(logits_g, logits_c), goal=f"<= {tol:g} (rel, norm)")


def optimizer_cases(xp, n: int = 300_001, dtype=np.float32):
    """``{name: (run, buffers)}``: each fused update on ``xp`` buffers made from the same seeded
    host values (the layout of ``ssdmpi/verify/fused_bench.py``'s cases, with a 0/1 decay mask)."""
    from ssdmpi.optim import fused

    rng = np.random.default_rng(0)
    host = {k: (rng.standard_normal(n) * 0.01).astype(dtype) for k in "WMGLPSD"}
    mask = (rng.random(n) < 0.9).astype(dtype)
    b = {k: xp.asarray(v.copy()) for k, v in host.items()}
    lr, lam, mu, N, C = 0.05, 1e-4, 0.9, 4, 12.0
    mask_x = xp.asarray(mask)
    decay = mask_x * dtype(lam)
    one, glu, own = fused.Plan((decay,), 2), fused.Plan((mask_x, decay), 3), fused.Plan((mask_x,), 1)
    W, M, G, L, P, S, D = (b[k] for k in "WMGLPSD")
    return b, {
        "momentum-sgd (global)": lambda: fused.momentum_sgd(one, W, M, G, lr, mu),
        "momentum-sgd (read only)": lambda: fused.momentum_sgd_read_only(one, L, G, M, lr, mu),
        "sgd (local)": lambda: fused.plain_local_sgd(one, L, G, lr, N),
        "glu-paper (local)": lambda: fused.glu_paper(glu, L, G, P, lr * lam, C, N, -(lr * 0.5), False),
        "glu-paper (local, snapshot)": lambda: fused.glu_paper(glu, L, G, P, lr * lam, C, N, -(lr * 0.5), True),
        "momentum-sgd (expanded)": lambda: fused.momentum_sgd_expanded(own, M, L, G, lr * lam, mu, lr),
        "post displacement": lambda: fused.post_displacement(own, W, L, S, D, True),
        "rebase": lambda: fused.rebase(own, W, L, S),
    }


def optimizers(log: PartLog, cupy) -> None:
    for dtype in (np.float32, np.float64):
        cpu_bufs, cpu = optimizer_cases(np, dtype=dtype)
        gpu_bufs, gpu = optimizer_cases(cupy, dtype=dtype)
        for name in cpu:
            for _ in range(3):                       # three applications: state carried over
                cpu[name]()
                gpu[name]()
            diffs = {k: int((backend.to_host(gpu_bufs[k]) != v).sum()) for k, v in cpu_bufs.items()}
            bad = {k: v for k, v in diffs.items() if v}
            log.check(f"{name} {np.dtype(dtype).name}: CuPy kernel == NumPy, bitwise", not bad,
                      value=sum(diffs.values()), goal="0 differing elements",
                      detail=", ".join(f"{k}: {v}" for k, v in bad.items()))


def engine(log: PartLog, cupy, repeats: int = 20) -> None:
    """ssdmpi's CuPy step vs PyTorch CUDA (same model, weights and batch), interleaved medians."""
    from ssdmpi.verify.torch_ref import torch_available

    ok, version = torch_available()
    if not ok:
        log.skip("engine: ssdmpi CuPy vs PyTorch CUDA", version)
        return
    import torch

    if not torch.cuda.is_available():
        log.skip("engine: ssdmpi CuPy vs PyTorch CUDA", f"PyTorch {version} sees no CUDA device")
        return
    log.note(f"PyTorch {version}, CUDA {torch.version.cuda}; CuPy {cupy.__version__}")
    for name, shape, options, batch, goal in (("resnet20", (3, 32, 32), {}, 128, 3.0),
                                               ("lenet5", (1, 28, 28), {}, 64, None),
                                               ("mlp", (1, 28, 28), {"widths": (512, 512)}, 128, None)):
        med = _engine_medians(cupy, torch, name, shape, options, batch, repeats)
        ratio = med["ssdmpi"] / med["torch"]
        value = {"ratio": ratio, "ssdmpi_ms": med["ssdmpi"] * 1e3, "torch_ms": med["torch"] * 1e3}
        if goal is None:
            log.note(f"engine {name} batch {batch}: ssdmpi {value['ssdmpi_ms']:.2f} ms, torch "
                     f"{value['torch_ms']:.2f} ms, ratio {ratio:.2f}")
        else:
            log.check(f"engine {name} batch {batch}: ssdmpi CuPy / PyTorch CUDA step", ratio <= goal,
                      value=value, goal=f"ratio <= {goal:g}")


def _engine_medians(cupy, torch, name, shape, options, batch, repeats) -> dict:
    """Median seconds of one step, ``{"ssdmpi": ..., "torch": ...}``, the two interleaved in
    alternating order after three warm-up rounds (kernels compiled, cuDNN tuned)."""
    import torch.nn.functional as F

    from ssdmpi.nn import build_model
    from ssdmpi.verify.torch_ref import build_torch_model

    model = build_model(name, shape, 10, xp=cupy, seed=0, **options)
    twin = build_torch_model(model).cuda()
    rng = np.random.default_rng(0)
    x, labels = rng.normal(size=(batch,) + shape).astype(np.float32), rng.integers(0, 10, size=batch)
    gx, glabels = cupy.asarray(x), cupy.asarray(labels)
    tx, tlabels = torch.from_numpy(x).cuda(), torch.from_numpy(labels).cuda()
    opt = torch.optim.SGD(twin.parameters(), lr=0.01)
    sync = cupy.cuda.get_current_stream().synchronize

    def ours():
        model.loss_and_grad(gx, glabels)
        model.params -= 0.01 * model.grads
        sync()

    def theirs():
        opt.zero_grad()
        F.cross_entropy(twin(tx), tlabels).backward()
        opt.step()
        torch.cuda.synchronize()

    times = {"ssdmpi": [], "torch": []}
    order = (("ssdmpi", ours), ("torch", theirs))
    for r in range(repeats + 3):
        for who, fn in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            fn()
            if r >= 3:
                times[who].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def _last_step_record(run_dir: str) -> tuple[dict | None, list]:
    """The last ``kind: step`` record of a run's metrics and every record (JSONL files in ``run_dir``)."""
    records = []
    for root, _, files in os.walk(run_dir):
        for f in files:
            if f.endswith(".jsonl"):
                with open(os.path.join(root, f)) as fh:
                    records += [json.loads(line) for line in fh if line.strip()]
    steps = [r for r in records if r.get("kind") == "step"]
    return (steps[-1] if steps else None), records


def training(log: PartLog, cupy, work: str, steps: int = 300) -> None:
    """``ssdmpi train --device gpu`` at 2 ranks, ssgd then ssd: both learn; the ssd step breakdown."""
    from ssdmpi.gpucheck.run import mpiexec

    os.makedirs(work, exist_ok=True)
    results = {}
    baseline, default = registry.BASELINE, registry.DEFAULT_ALGORITHM
    for algo in (baseline, default):
        run_dir = os.path.join(work, algo)
        cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "ssdmpi", "train", "--device", "gpu", "--algo", algo,
               "--steps", str(steps), "--log-every", "50", "--warmup-steps", "50", "--run-dir", run_dir]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=40)
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, output = "killed after 40 s", f"{exc.stdout or ''}{exc.stderr or ''}"
        wall = time.monotonic() - t0
        with open(os.path.join(work, f"{algo}.log"), "w") as f:
            f.write(output if isinstance(output, str) else output.decode(errors="replace"))
        last, records = _last_step_record(run_dir)
        evals = [r for r in records if r.get("kind") == "eval"]
        acc = evals[-1].get("test_acc") if evals else None
        results[algo] = {"wall_s": wall, "loss": last and last.get("loss"), "test_acc": acc,
                         "samples_per_s": last and last.get("samples_per_s")}
        learned = last is not None and last.get("loss") is not None and last["loss"] < 1.5 and (acc or 0) >= 0.8
        log.check(f"train {algo}: exits 0 and learns", rc == 0 and learned, value=results[algo],
                  goal="exit 0, last loss < 1.5, test acc >= 0.8", detail=f"exit {rc}; {' '.join(cmd)}")
        if registry.ALGORITHMS[algo].delay_stage and last is not None:
            breakdown = {k: last.get(k) for k in ("step_s", "compute_s", "inflight_s", "wait_s", "overlap")}
            log.note(f"{algo} per-step breakdown (last interval, means over ranks): "
                     + ", ".join(f"{k} {v:.4g}" for k, v in breakdown.items() if isinstance(v, (int, float))))
            log.check(f"train {algo}: per-step breakdown recorded", all(v is not None for v in breakdown.values()),
                      value=breakdown)
    if all(r["samples_per_s"] for r in results.values()):
        log.note("samples/s: " + ", ".join(f"{algo} {r['samples_per_s']:.0f}" for algo, r in results.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m ssdmpi.gpucheck.parts")
    parser.add_argument("part", choices=("models", "optimizers", "engine", "training"))
    parser.add_argument("file", help="where this part's checks are written (JSON)")
    parser.add_argument("--work", default=None, help="scratch folder (training runs)")
    args = parser.parse_args(argv)
    log = PartLog(args.file, args.part)
    cupy = backend.select("gpu")
    if args.part == "training":
        training(log, cupy, args.work or os.path.join(os.path.dirname(args.file), "training"))
    else:
        globals()[args.part](log, cupy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
