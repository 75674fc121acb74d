"""``ssdmpi bench engine``: one training step of ssdmpi's engine vs the same model in PyTorch.

A step is forward + backward + a plain SGD update (``params -= lr * grads``), on
the same random batch and the same initial weights for both. Both run
single-threaded (``torch.set_num_threads(1)``; NumPy's BLAS limited to 1 thread
with threadpoolctl, or set ``OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1`` yourself
when threadpoolctl is missing), and the two are INTERLEAVED step by step, with
alternating order, so load from other processes hits both alike; the medians
and their ratio (ssdmpi/torch) are reported. The ``gpt`` peer is nanoGPT's module
(``ssdmpi/verify/torch_gpt.py``) with its default attention, PyTorch's fused
``scaled_dot_product_attention``; its batches are random byte-level tokens.

Peak memory, in separate, untimed runs over the same scope for both -- building the
model, then two steps (the second with everything warm) on the same batch: ssdmpi's
as traced by ``tracemalloc`` (NumPy reports its allocations to it: model, workspace,
activations, temporaries); PyTorch's as its CPU allocator's running total of
allocated bytes at each allocation, which ``torch.profiler`` records with
``profile_memory=True``, less its value before the run's first allocation
(``tracemalloc`` does not see PyTorch's allocator). Both count the bytes the engines
ask for, not what the process holds from the OS.

PyTorch is the benchmark peer only, never a runtime dependency of ssdmpi.

``--json FILE`` writes the result file of ``ssdmpi/bench/result.py``: the command line, the
machine and the result dict of ``measure``.

Targets: mlp 784-512-512-10 batch 128 <= 1.15x; lenet5 batch 64 <=
1.5x; resnet20 batch 128 <= 2.0x and peak memory <= 1.5 GiB; gpt (the default sizes:
4 layers, 6 heads, width 192, vocabulary 256, context 128; 1,853,568 parameters) at
batch 32 x 128 tokens <= 1.3x and peak memory <= 1.5x PyTorch's. ``--check`` makes a
missed target exit 1.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from ssdmpi.bench import result as result_file
from ssdmpi.bench.flags import add_json, deprecated_alias, emit_json
from ssdmpi.bench.stats import median

# model -> (input shape, options, default batch, target ratio ssdmpi/torch)
SETUPS = {
    "mlp": ((1, 28, 28), {"widths": (512, 512)}, 128, 1.15),
    "lenet5": ((1, 28, 28), {}, 64, 1.5),
    "resnet20": ((3, 32, 32), {}, 128, 2.0),
    "gpt": ((128,), {}, 32, 1.3),
}
MEMORY_TARGET = {"resnet20": 1.5 * 2**30}             # bytes
MEMORY_RATIO_TARGET = {"gpt": 1.5}                    # ssdmpi's peak over PyTorch's
NUM_CLASSES = 10
VOCAB = 256                                           # gpt's classes: byte-level tokens
LR = 0.01


def add_arguments(parser) -> None:
    parser.add_argument("--model", choices=sorted(SETUPS), default="mlp",
                        help="mlp (784-512-512-10), lenet5 (28x28x1), resnet20 (32x32x3) or gpt (byte-level "
                             "tokens, context 128); default %(default)s")
    batch = parser.add_argument("--batch-size", type=int, default=None,
                                help="batch size (default: 128 mlp, 64 lenet5, 128 resnet20, 32 gpt)")
    deprecated_alias(parser, "--batch", batch)
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed steps per engine (default: 30 mlp/lenet5, 7 resnet20, 10 gpt)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per engine first (default %(default)s)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory steps")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    add_json(parser, "the result (one object)", legacy_switch=True)


def _limit_threads():
    """Limit NumPy's BLAS to one thread. Returns (how, limiter or None); the limiter restores on
    ``restore_original_limits()``."""
    try:
        import threadpoolctl
    except ImportError:
        if os.environ.get("OPENBLAS_NUM_THREADS") == "1" or os.environ.get("OMP_NUM_THREADS") == "1":
            return "env (OPENBLAS_NUM_THREADS/OMP_NUM_THREADS=1)", None
        return "UNLIMITED (install threadpoolctl or set OPENBLAS_NUM_THREADS=1)", None
    limiter = threadpoolctl.threadpool_limits(1)
    infos = [f"{i.get('internal_api')} {i.get('architecture') or ''}".strip()
             for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    return f"threadpoolctl, 1 thread ({', '.join(infos) or 'no BLAS found'})", limiter


def measure(model_name: str, batch: int | None = None, repeats: int | None = None, warmup: int = 2,
            memory: bool = True) -> dict:
    """Run the interleaved benchmark; return the result dict (times in seconds)."""
    from ssdmpi.errors import UserError
    from ssdmpi.verify import torch_ref

    torch_available = torch_ref.torch_available

    shape, options, default_batch, target = SETUPS[model_name]
    batch = default_batch if batch is None else int(batch)
    repeats = {"resnet20": 7, "gpt": 10}.get(model_name, 30) if repeats is None else int(repeats)
    if batch < 1 or repeats < 1 or warmup < 0:
        raise UserError("--batch-size and --repeats must be at least 1, --warmup at least 0")
    ok, why = torch_available()
    if not ok:
        raise UserError(f"bench engine compares against PyTorch, which is missing: {why}; "
                        "pip install torch (a benchmark peer only)")
    import torch

    threads, limiter = _limit_threads()
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(model_name, shape, options, batch, repeats, warmup, memory, threads, target,
                        default_batch)
    finally:
        torch.set_num_threads(torch_threads)
        if limiter is not None:
            limiter.restore_original_limits()


def _classes(model_name: str) -> int:
    return VOCAB if model_name == "gpt" else NUM_CLASSES


def _batch(model, batch: int, seed: int):
    """A random batch for ``model``: NCHW images or vectors and labels, or byte-level token ids and
    next-token labels (B, context) for a token model."""
    import numpy as np

    rng = np.random.default_rng(seed)
    classes = model.output_shape[-1]
    if model.input_kind == "tokens":
        shape = (batch,) + tuple(model.input_shape)
        return rng.integers(0, classes, size=shape), rng.integers(0, classes, size=shape)
    return (rng.normal(size=(batch,) + tuple(model.input_shape)).astype(np.float32),
            rng.integers(0, classes, size=batch))


def _torch_loss(twin, tx, tlabels):
    import torch.nn.functional as F

    logits = twin(tx)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tlabels.reshape(-1))


def _measure(model_name, shape, options, batch, repeats, warmup, memory, threads, target, default_batch) -> dict:
    import numpy as np
    import torch

    from ssdmpi.nn import build_model
    from ssdmpi.verify.torch_ref import build_torch_model

    model = build_model(model_name, shape, _classes(model_name), seed=0, **options)
    twin = build_torch_model(model)
    x, labels = _batch(model, batch, 0)
    tx, tlabels = torch.from_numpy(x.copy()), torch.from_numpy(labels.copy())
    opt = torch.optim.SGD(twin.parameters(), lr=LR)
    scratch = np.empty_like(model.params)

    def ssdmpi_step():
        model.loss_and_grad(x, labels)
        np.multiply(model.grads, LR, out=scratch)
        model.params -= scratch

    def torch_step():
        opt.zero_grad()
        _torch_loss(twin, tx, tlabels).backward()
        opt.step()

    for _ in range(warmup):
        ssdmpi_step()
        torch_step()
    times = {"ssdmpi": [], "torch": []}
    for r in range(repeats):
        order = (("ssdmpi", ssdmpi_step), ("torch", torch_step))
        for name, step in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)

    med = {k: median(v) for k, v in times.items()}
    at_default = batch == default_batch
    result = {
        "model": model_name, "input_shape": list(shape), "options": {k: list(v) if isinstance(v, tuple) else v
                                                                     for k, v in options.items()},
        "num_params": model.num_params, "batch": batch, "repeats": repeats, "warmup": warmup,
        "threads": threads, "torch_version": torch.__version__, "numpy_version": np.__version__,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "ssdmpi_median_s": med["ssdmpi"], "torch_median_s": med["torch"],
        "ssdmpi_min_s": min(times["ssdmpi"]), "torch_min_s": min(times["torch"]),
        "ratio": med["ssdmpi"] / med["torch"], "target_ratio": target,
        "target_met": med["ssdmpi"] / med["torch"] <= target if at_default else None,
    }
    if model.input_kind == "tokens":
        result["tokens_per_step"] = batch * model.input_shape[0]
    if memory:
        result["peak_memory_bytes"] = _peak_memory(model_name, shape, options, batch)
        mem_target = MEMORY_TARGET.get(model_name)
        result["memory_target_bytes"] = mem_target
        result["memory_target_met"] = (result["peak_memory_bytes"] <= mem_target
                                       if mem_target and at_default else None)
        torch_peak = result["torch_peak_memory_bytes"] = _torch_peak_memory(model, batch)
        result["memory_ratio"] = result["peak_memory_bytes"] / torch_peak if torch_peak else None
        ratio_target = MEMORY_RATIO_TARGET.get(model_name)
        result["memory_ratio_target"] = ratio_target
        result["memory_ratio_target_met"] = (result["memory_ratio"] <= ratio_target
                                             if ratio_target and at_default and torch_peak else None)
    return result


def _peak_memory(model_name, shape, options, batch) -> int:
    """Peak traced bytes of one training step, counting the model, its workspace and the batch."""
    import tracemalloc

    import numpy as np

    from ssdmpi.nn import build_model

    tracemalloc.start()
    try:
        model = build_model(model_name, shape, _classes(model_name), seed=0, **options)
        x, labels = _batch(model, batch, 1)
        scratch = np.empty_like(model.params)
        for _ in range(2):       # the second step runs with a warm workspace, like every later one
            model.loss_and_grad(x, labels)
            np.multiply(model.grads, LR, out=scratch)
            model.params -= scratch
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _torch_peak_memory(model, batch: int) -> int | None:
    """Peak bytes allocated by PyTorch's CPU allocator while building ``model``'s twin (weights copied
    from ``model``) and running two SGD steps on a batch: the allocator's running total at each
    allocation, as ``torch.profiler`` records it (``profile_memory=True``). None where this PyTorch's
    profiler does not expose its allocation events (they are read through its own memory profiler's
    internal API)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    try:
        from torch._C._profiler import _EventType
    except ImportError:
        return None

    from ssdmpi.verify.torch_ref import build_torch_model

    x, labels = _batch(model, batch, 1)
    tx, tlabels = torch.from_numpy(x), torch.from_numpy(labels)
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        twin = build_torch_model(model)
        opt = torch.optim.SGD(twin.parameters(), lr=LR)
        for _ in range(2):
            opt.zero_grad()
            _torch_loss(twin, tx, tlabels).backward()
            opt.step()
    try:
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
    except AttributeError:
        return None
    events = []
    while stack:
        node = stack.pop()
        fields = node.extra_fields
        if node.tag == _EventType.Allocation and str(fields.device) == "cpu":
            events.append((node.start_time_ns, int(fields.total_allocated), int(fields.alloc_size)))
        stack.extend(node.children)
    if not events:
        return None
    # the running total is process-wide: count from what it was before the first allocation here
    events.sort()
    before = events[0][1] - events[0][2]
    return max(total for _, total, _ in events) - before


@contextlib.contextmanager
def _quiet_stderr():
    """Send file descriptor 2 to /dev/null for the block: the profiler's C++ side prints a line
    when it starts and one when it stops, whatever its log level."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _fmt_ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


def run(args) -> int:
    result = measure(args.model, args.batch_size, args.repeats, args.warmup, memory=not args.no_memory)
    if args.json:
        emit_json(args.json, result_file.dumps({**result_file.provenance("engine"), **result}))
    if args.json != "-":
        opts = ", ".join(f"{k}={v}" for k, v in result["options"].items())
        tokens = f" x {result['input_shape'][0]} tokens" if "tokens_per_step" in result else ""
        print(f"engine benchmark: {result['model']}{' (' + opts + ')' if opts else ''}, input "
              f"{'x'.join(map(str, result['input_shape']))}, {result['num_params']:,} parameters, "
              f"batch {result['batch']}{tokens}, float32")
        print(f"  threads: {result['threads']}; torch {result['torch_version']}, numpy {result['numpy_version']}")
        if result["openblas_coretype"]:
            print(f"  note: OPENBLAS_CORETYPE={result['openblas_coretype']} is set: it pins NumPy's BLAS to an older "
                  "kernel; to measure the current one, run this command alone under "
                  "'env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE' and check the kernel named above")
        print(f"  one step (forward + backward + SGD), {result['repeats']} interleaved repeats:")
        print(f"    ssdmpi  median {_fmt_ms(result['ssdmpi_median_s'])}  (min {_fmt_ms(result['ssdmpi_min_s'])})")
        print(f"    torch   median {_fmt_ms(result['torch_median_s'])}  (min {_fmt_ms(result['torch_min_s'])})")
        verdict = {True: "met", False: "MISSED", None: "n/a at this batch size"}[result["target_met"]]
        print(f"  ratio ssdmpi/torch: {result['ratio']:.3f}  (target <= {result['target_ratio']}: {verdict})")
        if "peak_memory_bytes" in result:
            line = f"  peak memory of one ssdmpi step (tracemalloc): {result['peak_memory_bytes'] / 2**20:.1f} MiB"
            if result["memory_target_bytes"]:
                verdict = {True: "met", False: "MISSED", None: "n/a at this batch size"}[result["memory_target_met"]]
                line += f"  (target <= {result['memory_target_bytes'] / 2**30:.1f} GiB: {verdict})"
            print(line)
        if result.get("memory_ratio") is not None:
            line = (f"  peak memory of one torch step (its allocator, torch.profiler): "
                    f"{result['torch_peak_memory_bytes'] / 2**20:.1f} MiB; "
                    f"ratio ssdmpi/torch {result['memory_ratio']:.3f}")
            if result["memory_ratio_target"]:
                verdict = {True: "met", False: "MISSED",
                           None: "n/a at this batch size"}[result["memory_ratio_target_met"]]
                line += f"  (target <= {result['memory_ratio_target']}: {verdict})"
            print(line)
    missed = (result["target_met"] is False or result.get("memory_target_met") is False
              or result.get("memory_ratio_target_met") is False)
    return 1 if (args.check and missed) else 0
