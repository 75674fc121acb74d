"""Static checks of the job templates (no cluster needed): they parse, carry the
#SBATCH settings preemption depends on, and the copies of the launch block agree."""

import re
import subprocess

import pytest

from tests.slurm.conftest import JOBS

TEMPLATES = ("train.sbatch", "sweep.sbatch", "bench.sbatch")


def sbatch_options(name: str) -> list[str]:
    return re.findall(r"^#SBATCH\s+(\S+)", (JOBS / name).read_text(), flags=re.M)


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_is_valid_bash(name):
    r = subprocess.run(["bash", "-n", str(JOBS / name)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", ("train.sbatch", "sweep.sbatch"))
def test_resumable_templates_ask_for_signal_requeue_and_appended_output(name):
    opts = sbatch_options(name)
    assert "--requeue" in opts
    assert "--open-mode=append" in opts        # the requeued run must not truncate the first run's log
    assert any(re.fullmatch(r"--signal=B:USR1@\d+", o) for o in opts)   # B: the batch shell, which forwards it
    assert any(o.startswith("--output=") and re.search(r"%[jAa]", o) for o in opts)


def test_train_and_sweep_share_one_launch_block():
    """The launch/trap/wait/requeue code is copied (templates must stand alone): keep the copies equal."""
    def block(name):
        text = (JOBS / name).read_text()
        return text[text.index('case "$LAUNCHER" in'):]
    assert block("train.sbatch") == block("sweep.sbatch")


def test_cluster_fixture_says_why_it_cannot_start(monkeypatch):
    """Without root or without the packages the Slurm tests skip, naming the reason."""
    from tests.slurm import conftest

    monkeypatch.setattr(conftest.os, "geteuid", lambda: 1000)
    assert "needs root" in conftest._missing()
    monkeypatch.setattr(conftest.os, "geteuid", lambda: 0)
    monkeypatch.setattr(conftest.shutil, "which", lambda name, path=None: None if name == "slurmd" else "/x")
    reason = conftest._missing()
    assert "missing slurmd" in reason and "apt-get install slurm-wlm munge" in reason
