"""AlgoConfig: defaults per algorithm, and one-line UserErrors for nonsense."""

import pytest

from ssdmpi.algos import AlgoConfig
from ssdmpi.errors import UserError


def test_defaults_resolve_per_algorithm():
    ssd = AlgoConfig().validate(world_size=4)
    assert (ssd.algo, ssd.delay, ssd.comm, ssd.period_rule, ssd.merge_delay, ssd.warmup_steps) == \
        ("ssd", 5, "period", "delta-merge", 1, 0)
    assert ssd.local_lr is None and ssd.glu_divisor is None and ssd.local_update is None
    step = AlgoConfig(comm="step").validate(world_size=4)
    assert (step.local_update, step.period_rule) == ("global-momentum", None)
    od = AlgoConfig(algo="odsgd").validate(4)
    assert (od.delay, od.comm) == (1, "step")
    loc = AlgoConfig(algo="localsgd").validate(4)
    assert (loc.delay, loc.comm, loc.local_update) == (5, None, None)
    assert AlgoConfig(algo="ssgd").validate(4).delay is None


def test_glu_paper_defaults_local_lr_to_world_size_times_lr_and_divisor_12():
    c = AlgoConfig(comm="step", local_update="glu-paper", lr=0.1).validate(world_size=4)
    assert c.local_lr == pytest.approx(0.4) and c.glu_divisor == 12.0
    assert AlgoConfig(comm="step", local_update="sgd", lr=0.1, local_lr=0.3).validate(4).local_lr == 0.3


def test_a_local_update_without_comm_says_it_needs_comm_step():
    with pytest.raises(UserError, match="it is for --comm step: add --comm step"):
        AlgoConfig(local_update="glu-paper").validate(4)


def test_period_rule_defaults_when_comm_period():
    c = AlgoConfig(comm="period").validate(2)
    assert c.period_rule == "delta-merge"
    assert c.local_update is None and c.merge_delay == 1   # delta-merge has its own local step (PERIOD_RULE.md)
    assert AlgoConfig(comm="period", period_rule="replay").validate(2).local_update == "global-momentum"
    assert AlgoConfig(comm="period", period_rule="delta-own").validate(2).local_update is None


def test_merge_delay_defaults_for_delta_merge_only():
    c = AlgoConfig(period_rule="delta-merge", delay=5).validate(2)
    assert c.merge_delay == 1
    assert AlgoConfig(period_rule="delta-merge", delay=5, merge_delay=5).validate(2).merge_delay == 5
    auto = dict(period_rule="delta-merge", delay="auto", warmup_steps=10)
    assert AlgoConfig(**auto).validate(2).merge_delay is None   # auto chooses it
    assert AlgoConfig(**auto, merge_delay=3).validate(2).merge_delay == 3
    assert AlgoConfig(period_rule="delta-own").validate(2).merge_delay is None
    assert AlgoConfig(comm="step").validate(2).merge_delay is None


BAD = [
    (dict(delay=0), "--delay must be a positive integer"),
    (dict(delay=-3), "--delay"),
    (dict(warmup_steps=-1), "--warmup-steps must be an integer >= 0"),
    (dict(algo="sdd"), "--algo 'sdd' is not one of"),
    (dict(comm="sometimes"), "--comm 'sometimes'"),
    (dict(algo="localsgd", comm="step"), "--comm step does not apply to --algo localsgd"),
    (dict(algo="localsgd", comm="period"), "does not apply to --algo localsgd"),
    (dict(algo="ssgd", comm="step"), "does not apply to --algo ssgd"),
    (dict(algo="ssgd", delay=5), "--delay does not apply to --algo ssgd"),
    (dict(algo="odsgd", delay=5), "odsgd is ssd with --delay 1 --comm step"),
    (dict(algo="odsgd", comm="period"), "odsgd is ssd with --delay 1 --comm step"),
    (dict(comm="step", period_rule="replay"), "--period-rule applies only to --algo ssd --comm period"),
    (dict(comm="period", period_rule="magic"), "--period-rule 'magic' is not one of"),
    (dict(local_update="adam"), "--local-update 'adam' is not one of"),
    (dict(algo="localsgd", local_update="sgd"), "--local-update does not apply to --algo localsgd"),
    (dict(comm="period", period_rule="delta-own", local_update="sgd"), "--local-update does not apply"),
    (dict(comm="period", local_update="glu-paper"), "--local-update does not apply to --algo ssd --comm period"),
    (dict(comm="period", glu_divisor=16.0), "--glu-divisor applies only"),
    (dict(local_lr=0.4), "--local-lr applies only to --local-update glu-paper or sgd"),
    (dict(comm="step", local_update="sgd", local_lr=-1.0), "--local-lr must be > 0"),
    (dict(glu_divisor=16.0), "--glu-divisor applies only to --local-update glu-paper"),
    (dict(comm="step", local_update="glu-paper", glu_divisor=0.0), "--glu-divisor must be > 0"),
    (dict(comm="period", period_rule="delta-own", merge_delay=1), "--merge-delay applies only to --comm period "
                                                                  "--period-rule delta-merge"),
    (dict(comm="step", merge_delay=1), "--merge-delay applies only"),
    (dict(algo="localsgd", merge_delay=1), "--merge-delay applies only"),
    (dict(algo="asgd", merge_delay=1), "--merge-delay applies only to --comm period --period-rule delta-merge"),
    (dict(period_rule="delta-merge", merge_delay=0), "--merge-delay must be a positive integer"),
    (dict(period_rule="delta-merge", delay=3, merge_delay=4), "--merge-delay 4 is longer than the period --delay 3"),
    (dict(lr=0.0), "--lr must be > 0"),
    (dict(lr=float("nan")), "--lr must be a finite number"),
    (dict(momentum=1.0), "--momentum must be < 1"),
    (dict(weight_decay=-1e-4), "--weight-decay must be >= 0"),
    (dict(lr_schedule="cosine"), "needs a run length"),
    (dict(lr_schedule="triangle"), "unknown lr schedule"),
]


@pytest.mark.parametrize("settings,message", BAD, ids=[str(s) for s, _ in BAD])
def test_nonsense_is_a_one_line_user_error(settings, message):
    with pytest.raises(UserError) as e:
        AlgoConfig(**settings).validate(world_size=2)
    text = str(e.value)
    assert message in text, text
    assert "\n" not in text


def test_validate_does_not_modify_the_original():
    c = AlgoConfig(algo="odsgd")
    c.validate(2)
    assert c.delay is None and c.comm is None


def test_to_dict_is_plain():
    d = AlgoConfig(lr_schedule={"kind": "multistep", "milestones": [3]}).validate(2).to_dict()
    assert all(isinstance(v, (str, int, float, type(None))) for v in d.values())
