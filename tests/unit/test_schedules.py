"""Learning-rate schedules: values at chosen steps, warm-up, and bad settings."""

import math

import pytest

from ssdmpi.errors import UserError
from ssdmpi.optim import LRSchedule


def test_constant():
    s = LRSchedule(0.1)
    assert [s(t) for t in (0, 10, 10**6)] == [0.1, 0.1, 0.1]


def test_step_and_multistep():
    s = LRSchedule(1.0, "step", every=10, gamma=0.5)
    assert [s(t) for t in (0, 9, 10, 19, 20)] == [1.0, 1.0, 0.5, 0.5, 0.25]
    m = LRSchedule(0.4, "multistep", milestones=(80, 120), gamma=0.1)
    assert m(79) == 0.4 and m(80) == pytest.approx(0.04) and m(120) == pytest.approx(0.004)


def test_cosine_and_poly_decay_to_zero_over_the_run():
    c = LRSchedule(1.0, "cosine", total_steps=100)
    assert c(0) == 1.0 and c(50) == pytest.approx(0.5) and c(100) == pytest.approx(0.0, abs=1e-15)
    assert c(25) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    p = LRSchedule(0.8, "poly", total_steps=100)                 # power 2 by default
    assert p(0) == 0.8 and p(50) == pytest.approx(0.8 * 0.25) and p(100) == 0.0 and p(1000) == 0.0


def test_linear_warmup_then_schedule():
    p = LRSchedule(1.0, "poly", warmup_steps=10, total_steps=110)
    assert p(0) == pytest.approx(0.1) and p(4) == pytest.approx(0.5) and p(9) == pytest.approx(1.0)
    assert p(10) == 1.0 and p(60) == pytest.approx(0.25)          # decay counts the steps after warm-up
    s = LRSchedule(0.5, "multistep", warmup_steps=4, milestones=(6,))
    assert [s(t) for t in range(8)] == pytest.approx([0.125, 0.25, 0.375, 0.5, 0.5, 0.5, 0.05, 0.05])


def test_factor_is_the_shape():
    s = LRSchedule(0.3, "step", every=2, gamma=0.1)
    assert s.factor(3) == pytest.approx(0.1) and s(3) == pytest.approx(0.03)


def test_from_spec():
    s = LRSchedule.from_spec(0.1, {"kind": "multistep", "milestones": [5, 9]}, total_steps=20)
    assert s.milestones == (5, 9) and s(5) == pytest.approx(0.01)
    assert LRSchedule.from_spec(0.1, "cosine", total_steps=10, warmup_steps=2).warmup_steps == 2


@pytest.mark.parametrize("kwargs,words", [
    (dict(base_lr=0.1, kind="linear"), "unknown lr schedule"),
    (dict(base_lr=0.0), "> 0"),
    (dict(base_lr=0.1, kind="cosine"), "run length"),
    (dict(base_lr=0.1, kind="poly", total_steps=5, warmup_steps=5), "run length"),
    (dict(base_lr=0.1, kind="step"), "step length"),
    (dict(base_lr=0.1, kind="multistep", milestones=(5, 3)), "increasing"),
    (dict(base_lr=0.1, warmup_steps=-1), "warm-up"),
])
def test_bad_settings_are_one_line_user_errors(kwargs, words):
    with pytest.raises(UserError) as e:
        LRSchedule(**kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_unknown_spec_option():
    with pytest.raises(UserError, match="unknown lr schedule option"):
        LRSchedule.from_spec(0.1, {"kind": "step", "evry": 3})
