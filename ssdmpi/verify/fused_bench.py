"""The unfused updates (one full pass over the buffers per operation) and a benchmark against the fused ones.

The ``unfused_*`` functions are the updates as they were written before ``ssdmpi/optim/fused.py``,
operation for operation; the tests (tests/unit/test_fused.py) use them as the bitwise oracle.

``python -m ssdmpi.verify.fused_bench`` times old against new for each update on the wide-mlp's
20,041,642 float32 parameters, alternating old/new runs, and prints medians, spread and the ratio;
``--sweep`` times the fused updates at several block sizes. Set ``OMP_NUM_THREADS=1``: a measurement,
not a test. Buffers hold random normal values; the mask is the wide-mlp's (weights 1, biases 0).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ssdmpi.optim import fused
from ssdmpi.optim.optimizers.adamw import adamw_pass

WIDE_MLP = ((784, 4096), (4096, 4096), (4096, 10))     # (fan_in, fan_out) of its dense layers


def unfused_momentum_sgd(W, M, G, decay, lr, mu, tmp):
    np.multiply(W, decay, out=tmp)
    tmp += G
    tmp *= lr
    M *= mu
    M -= tmp
    W += M


def unfused_momentum_sgd_read_only(L, g, M, decay, lr, mu, a, b):
    np.multiply(L, decay, out=a)
    a += g
    a *= lr
    np.multiply(M, mu, out=b)
    L += b
    L -= a


def unfused_plain_local_sgd(L, g, decay, lr, n, a, b):
    np.multiply(L, decay, out=a)
    np.divide(g, n, out=b)
    a += b
    a *= lr
    L -= a


def unfused_glu_paper(L, g, P, mask, decay, lr, lam, C, n, f, snap, a, b, c):
    np.multiply(mask, lr * lam, out=a)
    np.subtract(1, a, out=a)
    np.multiply(a, P, out=b)
    b -= L
    b /= C
    b *= 0.5
    np.divide(g, n, out=a)
    a *= 2
    np.multiply(L, decay, out=c)
    a += c
    a += b
    a *= -(lr * f)
    if snap:
        P[...] = L
    L += a


def unfused_momentum_sgd_expanded(U, L, g, mask, eta, lam, mu, tmp):
    np.multiply(L, mask, out=tmp)
    tmp *= eta * lam
    U *= mu
    U -= tmp
    np.multiply(g, eta, out=tmp)
    U -= tmp
    L += U


def unfused_adamw(W, m, v, G, mask, inv, keep, w1, w2, b2, bc2s, eps, negstep, n, c, write, a, d, e):
    """AdamW (``ssdmpi/optim/optimizers/adamw.py``): ``[G /= n]; [g = G*c]; W *= mask*keep + inv;
    m' = m + (g - m)*w1; v' = v*b2 + (g*g)*w2; [m = m'; v = v']; W += (m'*negstep)/((sqrt(v')/bc2s) + eps)``;
    the scratch ``a``, ``d``, ``e`` are whole buffers."""
    if write and n is not None and n != 1:
        G /= n
    g = G
    if c != 1.0:
        g = np.multiply(G, c)
    np.multiply(mask, keep, out=a)
    a += inv
    W *= a
    np.subtract(g, m, out=d)
    d *= w1
    np.multiply(g, g, out=a)
    a *= w2
    if write:
        m += d
        v *= b2
        v += a
        mnew, vnew = m, v
    else:
        d += m
        np.multiply(v, b2, out=e)
        e += a
        mnew, vnew = d, e
    np.sqrt(vnew, out=a)
    a /= bc2s
    a += eps
    np.multiply(mnew, negstep, out=d)
    d /= a
    W += d


def unfused_post_displacement(W, L, S, D, changed):
    np.subtract(L, S, out=D)
    if changed:
        np.add(W, D, out=L)
    S[...] = L


def unfused_rebase(W, L, S, tmp):
    np.subtract(L, S, out=tmp)
    np.add(W, tmp, out=L)
    S[...] = W


def wide_mlp_mask(dtype=np.float32):
    """The wide-mlp's flat decay mask: each layer's weights (1) then its bias (0)."""
    parts = []
    for fan_in, fan_out in WIDE_MLP:
        parts += [np.ones(fan_in * fan_out, dtype), np.zeros(fan_out, dtype)]
    return np.concatenate(parts)


def cases(mask, block_bytes=fused.BLOCK_BYTES, seed=0):
    """``{kind: (old, new)}``: zero-argument callables doing one update in place on shared buffers."""
    rng = np.random.default_rng(seed)
    n, dt = mask.size, mask.dtype
    W, M, G, L, P, S, D = (rng.standard_normal(n, dtype=dt) * 0.01 for _ in range(7))
    lr, lam, mu, N, C = 0.05, 1e-4, 0.9, 4, 12.0
    decay = mask * lam
    big = [np.empty(n, dt) for _ in range(3)]
    one = fused.Plan((decay,), 2, block_bytes)
    glu = fused.Plan((mask, decay), 3, block_bytes)
    own = fused.Plan((mask,), 1, block_bytes)
    inv = 1 - mask
    adam = fused.Plan((mask, inv), 4, block_bytes)
    V = np.abs(rng.standard_normal(n, dtype=dt)) * 1e-4
    scal = (1 - lr * 0.1, 1 - 0.9, 1 - 0.95, 0.95, (1 - 0.95 ** 10) ** 0.5, 1e-8, -(lr / (1 - 0.9 ** 10)))
    return {
        "adamw (global)": (lambda: unfused_adamw(W, M, V, G, mask, inv, *scal, None, 1.0, True, *big),
                           lambda: adamw_pass(adam, W, M, V, G, *scal)),
        "adamw (read only)": (lambda: unfused_adamw(L, M, V, G, mask, inv, *scal, None, 1.0, False, *big),
                              lambda: adamw_pass(adam, L, M, V, G, *scal, write=False)),
        "momentum-sgd (global)": (lambda: unfused_momentum_sgd(W, M, G, decay, lr, mu, big[0]),
                                  lambda: fused.momentum_sgd(one, W, M, G, lr, mu)),
        "momentum-sgd (read only)": (lambda: unfused_momentum_sgd_read_only(L, G, M, decay, lr, mu, *big[:2]),
                                    lambda: fused.momentum_sgd_read_only(one, L, G, M, lr, mu)),
        "sgd (local)": (lambda: unfused_plain_local_sgd(L, G, decay, lr, N, *big[:2]),
                        lambda: fused.plain_local_sgd(one, L, G, lr, N)),
        "glu-paper (local, m%k!=0)": (lambda: unfused_glu_paper(L, G, P, mask, decay, lr, lam, C, N, 0.5, False, *big),
                                      lambda: fused.glu_paper(glu, L, G, P, lr * lam, C, N, -(lr * 0.5), False)),
        "momentum-sgd (expanded)": (lambda: unfused_momentum_sgd_expanded(M, L, G, mask, lr, lam, mu, big[0]),
                           lambda: fused.momentum_sgd_expanded(own, M, L, G, lr * lam, mu, lr)),
        "post displacement": (lambda: unfused_post_displacement(W, L, S, D, True),
                               lambda: fused.post_displacement(own, W, L, S, D, True)),
    }


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _row(name, old, new):
    mo, mn = statistics.median(old), statistics.median(new)
    return (f"{name:28s} old {mo * 1e3:7.1f} ms [{min(old) * 1e3:6.1f}-{max(old) * 1e3:6.1f}]  "
            f"new {mn * 1e3:7.1f} ms [{min(new) * 1e3:6.1f}-{max(new) * 1e3:6.1f}]  old/new {mo / mn:5.2f}x")


def bench(repeats: int) -> None:
    """Old and new of each update, alternated ``repeats`` times after one warm-up run each."""
    mask = wide_mlp_mask()
    print(f"{mask.size} float32 parameters, block {fused.BLOCK_BYTES // 1024} KiB, {repeats} runs each, "
          f"median [min-max]")
    for name, (old, new) in cases(mask).items():
        old(), new()
        times = ([], [])
        for _ in range(repeats):
            times[0].append(_time(old))
            times[1].append(_time(new))
        print(_row(name, *times), flush=True)


def sweep(repeats: int, sizes_kib=(16, 32, 64, 128, 256, 512, 1024)) -> None:
    """Median time of each fused update at each block size (sizes interleaved within a repeat)."""
    mask = wide_mlp_mask()
    per = {kib: cases(mask, kib * 1024) for kib in sizes_kib}
    for name in per[sizes_kib[0]]:
        times = {kib: [] for kib in sizes_kib}
        for _ in range(repeats):
            for kib in sizes_kib:
                times[kib].append(_time(per[kib][name][1]))
        print(f"{name:28s} " + "  ".join(f"{kib}K {statistics.median(t) * 1e3:6.1f}" for kib, t in times.items()),
              flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m ssdmpi.verify.fused_bench",
                                description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--sweep", action="store_true", help="time the fused updates at several block sizes")
    args = p.parse_args(argv)
    (sweep if args.sweep else bench)(args.repeats)


if __name__ == "__main__":
    main()
