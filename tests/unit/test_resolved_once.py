"""A start resolves its configuration once: ``registry.resolve`` (the one check of the algorithm's and the
optimizer's settings) runs once per ``ssdmpi train`` and per ``ssdmpi.train(...)``, whatever reads the
config afterwards (the trainer, the algorithm, the checkpoint, the summary)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

COUNTING = """
import json, sys
from ssdmpi.algos import registry
calls = []
resolve = registry.resolve
def counted(*args, **kwargs):
    calls.append(1)
    return resolve(*args, **kwargs)
registry.resolve = counted
{body}
print(json.dumps({{"resolved": len(calls), "code": code}}))
"""


def run(body: str, tmp_path) -> dict:
    proc = subprocess.run([sys.executable, "-c", COUNTING.format(body=body)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("algo", ["ssd", "ssgd", "localsgd"])
def test_the_command_resolves_once(tmp_path, algo):
    body = ("from ssdmpi.cli import main\n"
            f"code = main(['train', '--algo', '{algo}', '--steps', '30', '--warmup-steps', '5', '--log-every', '10', "
            "'--run-dir', 'run', '--no-progress-bar'])")
    assert run(body, tmp_path) == {"resolved": 1, "code": 0}


def test_the_python_api_resolves_once_and_a_resume_once_more(tmp_path):
    body = ("import ssdmpi\n"
            "first = ssdmpi.train({'steps': 20, 'warmup_steps': 5, 'run_dir': 'run', 'progress_bar': False})\n"
            "again = ssdmpi.train({'steps': 30, 'warmup_steps': 5, 'run_dir': 'run', 'resume': 'auto', "
            "'progress_bar': False})\n"
            "code = first.exit_code + again.exit_code")
    assert run(body, tmp_path) == {"resolved": 2, "code": 0}
