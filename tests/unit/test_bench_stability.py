"""The stability map (``ssdmpi bench stability``) against a direct step-by-step simulation of the same equations.

The simulation here is written from the rules' specification (docs/PERIOD_RULE.md), one scalar
per rank, in plain Python floats, independently of the matrices of ``ssdmpi/algos/stability.py``;
``delta-merge`` is simulated in its shift form (``L += mean D - own D`` at the merge), not the
form the map uses, with its momentum merge (``U <- (1 - a) U + a P / k``) where one is given.
Below the threshold the map reports, the state must stay bounded; just above it, it must grow
(for a rule whose mean model is exact, that is the spread between the ranks).
Also: the cheap form of the merge equals the shift form in exact arithmetic, and the map
reproduces the reference figures of the linear model.
"""

import json
from fractions import Fraction

import pytest

from ssdmpi.algos import registry, stability
from tests.conftest import run_cli

MU = 0.9
MAPS = {**registry.linear_maps(), "damp": stability.DAMP}


def threshold(rule, k, d=None, merge=0.0, **more):
    """The map's threshold of ``rule`` at ``k`` (delta-merge: at merge delay ``d``, momentum merge ``merge``)."""
    own = {"merge_delay": d, "merge_momentum": merge} if rule == "delta-merge" else {}
    return stability.threshold(MAPS[rule], k, **own, **more)


def period_map(rule, x, k, d=None, merge=0.0):
    own = {"merge_delay": d, "merge_momentum": merge} if rule == "delta-merge" else {}
    return stability.period_map(MAPS[rule], x, k, **own)


def simulate(rule, x, k, d=None, periods=3000, a=0.5, merge=0.0):
    """The largest magnitude in the state after each period of ``rule`` at ``eta*h = x`` (2 ranks, no
    noise). Start: the switch (every ``L`` at ``W = 1``), the ranks' velocities apart (0.1, -0.3)."""
    W, M = 1.0, 0.0
    L, U = [W, W], [0.1, -0.3]
    S, P, Down = list(L), None, [0.0, 0.0]
    out = []
    for _ in range(periods):
        for j in range(k):
            if rule == "ssgd":
                M = MU * M - x * W
                W = W + M
                continue
            for r in range(2):
                U[r] = MU * U[r] - x * L[r]
                L[r] = L[r] + U[r]
            if rule == "delta-merge" and j == d - 1 and P is not None:    # shift form
                for r in range(2):
                    U[r] = (1 - merge) * U[r] + merge * P / k
                    L[r] += P - Down[r]
                    S[r] += P - Down[r]
                W, P = W + P, None
        if rule == "localsgd":
            W = sum(L) / 2
            L = [W, W]
        elif rule == "delta-merge":
            Down = [L[r] - S[r] for r in range(2)]
            P = sum(Down) / 2
            S = list(L)
        elif rule in ("delta-own", "damp"):                   # PERIOD_RULE.md section 3
            D = [L[r] - S[r] for r in range(2)]
            if P is not None:
                W = W + P
                f = 1.0 if rule == "delta-own" else a
                L = [W + f * D[r] for r in range(2)]
            P = sum(D) / 2
            S = list(L)
        out.append(max(abs(v) for v in ([W, M] if rule == "ssgd" else [W] + L + U)))
    return out


CASES = [("ssgd", 1, None, 0.0), ("localsgd", 5, None, 0.0), ("localsgd", 10, None, 0.0), ("delta-own", 2, None, 0.0),
         ("delta-own", 5, None, 0.0), ("delta-own", 10, None, 0.0), ("delta-merge", 5, 1, 0.0),
         ("delta-merge", 10, 2, 0.0), ("delta-merge", 20, 3, 0.0), ("delta-merge", 20, 6, 0.0), ("damp", 10, None, 0.0),
         ("delta-merge", 5, 1, 1.0), ("delta-merge", 10, 1, 1.0), ("delta-merge", 10, 2, 1.0),
         ("delta-merge", 20, 1, 1.0), ("delta-merge", 10, 3, 1.0), ("delta-merge", 5, 1, 0.5)]


@pytest.mark.parametrize("rule,k,d,merge", CASES)
def test_spread_bounded_below_the_threshold_and_growing_above(rule, k, d, merge):
    x = threshold(rule, k, d, merge)
    assert 0 < x < stability.X_MAX
    below = simulate(rule, x / 1.01, k, d, merge=merge)
    above = simulate(rule, x * 1.01, k, d, merge=merge)
    assert max(below[-100:]) < 1.0, (rule, k, d, merge, x, below[-1])
    assert not above[-1] < 100.0, (rule, k, d, merge, x, above[-1])             # grown (or overflowed: inf, nan)


def test_the_momentum_merge_changes_the_map_and_only_delta_merge_takes_one():
    x = stability.grid(0.01, 3.0, 0.05)
    a = stability.spectral_radius(period_map("delta-merge", x, 5, 1))
    b = stability.spectral_radius(period_map("delta-merge", x, 5, 1, merge=1.0))
    assert abs(a - b).max() > 0.01
    with pytest.raises(TypeError):
        stability.period_map(MAPS["delta-own"], x, 5, merge_momentum=1.0)
    assert [s.name for s in registry.swept("delta-merge")] == ["merge_delay", "merge_momentum"]
    assert registry.swept("delta-own") == () and registry.swept("replay") == ()


def test_delta_merge_with_d_equal_k_is_delta_own():
    x = stability.grid(0.01, 3.0, 0.05)
    for k in (2, 5, 10):
        a = stability.spectral_radius(period_map("delta-merge", x, k, k))
        b = stability.spectral_radius(period_map("delta-own", x, k))
        assert abs(a - b).max() < 1e-9


def test_cheap_merge_equals_the_shift_form_in_exact_arithmetic():
    """At the merge ``W <- W + P; L <- W + (L - S); S <- W`` equals ``L += P - D_own; S += P - D_own``
    (and the next posted D), rational arithmetic, 3 ranks, gradients that depend on L, lr changing."""
    N, k, h = 3, 4, Fraction(3, 7)
    for d in (1, 2, 4):
        states = []
        for form in ("cheap", "shift"):
            L = [Fraction(r + 1, 3) for r in range(N)]
            U = [Fraction(0)] * N
            W = Fraction(0)
            S, P, Down, posted = list(L), None, [Fraction(0)] * N, []
            W = L[0]
            L = [W] * N
            S = list(L)
            for t in range(6 * k):
                eta = Fraction(1, 10 + t % 3)
                for r in range(N):
                    U[r] = Fraction(9, 10) * U[r] - eta * (h * L[r] + Fraction(r - 1, 5 + t))
                    L[r] = L[r] + U[r]
                m = t
                if (m + 1 - d) % k == 0 and m + 1 - d >= k:
                    if form == "cheap":
                        W = W + P
                        L = [W + (L[r] - S[r]) for r in range(N)]
                        S = [W] * N
                    else:
                        L = [L[r] + P - Down[r] for r in range(N)]
                        S = [S[r] + P - Down[r] for r in range(N)]
                        W = W + P
                if (m + 1) % k == 0:
                    Down = [L[r] - S[r] for r in range(N)]
                    P = sum(Down) / N
                    posted.append(P)
                    S = list(L)
            states.append((W, L, posted))
        assert states[0] == states[1]


def test_reference_figures():
    """The linear model's reference figures (2 ranks, momentum 0.9): SSGD's 2(1 + mu); delta-own's
    thresholds at k = 2, 5, 10, 20; delta-merge at (k, d) = (5, 1), (10, 2), (20, 6), (20, 3)."""
    assert threshold("ssgd", 1) == pytest.approx(3.8, rel=0.003)
    for k, ref in ((2, 0.91), (5, 0.19), (10, 0.053), (20, 0.015)):
        assert threshold("delta-own", k) == pytest.approx(ref, rel=0.01)
    for k, d, ref in ((5, 1, 2.0), (10, 2, 1.17), (20, 6, 2.18), (20, 3, 3.57)):
        assert threshold("delta-merge", k, d) == pytest.approx(ref, rel=0.02)


def test_grid_is_geometric_from_x_min_to_x_max():
    x = stability.grid()
    assert x[0] == stability.X_MIN and x[-1] <= stability.X_MAX < x[-1] * (1 + stability.STEP)
    assert (x[1:] / x[:-1]) == pytest.approx(1 + stability.STEP)


def test_command_prints_the_table_and_writes_the_json(tmp_path):
    out = tmp_path / "t.json"
    proc = run_cli(["bench", "stability", "--rules", "ssgd,delta-own,delta-merge", "--delays", "2,5",
                    "--merge-delay", "1,3", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert "| delta-merge, merge-delay 3, merge-momentum 0 |  | 0.168 |" in proc.stdout    # d = 3 > k = 2: empty
    assert "| delta-merge, merge-delay 1, merge-momentum 1 | 1.34 | 1.62 |" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rule"], r["k"], r.get("merge_delay"), r.get("merge_momentum")) for r in rows] == [
        ("ssgd", "", None, None), ("delta-own", 2, None, None), ("delta-own", 5, None, None),
        ("delta-merge", 2, 1, 0.0), ("delta-merge", 2, 1, 1.0), ("delta-merge", 5, 1, 0.0), ("delta-merge", 5, 1, 1.0),
        ("delta-merge", 5, 3, 0.0), ("delta-merge", 5, 3, 1.0)]
    for r in rows:
        assert r["threshold"] == round(threshold(r["rule"], r["k"] or 1, r.get("merge_delay"),
                                                 r.get("merge_momentum") or 0.0), 4)


@pytest.mark.parametrize("argv", [["--rules", "nope"], ["--delays", "0"], ["--merge-delay", "x"], ["--ranks", "1"],
                                  ["--momentum", "1"], ["--merge-momentum", "1.5"]])
def test_bad_arguments_are_one_line_errors(argv):
    proc = run_cli(["bench", "stability"] + argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
