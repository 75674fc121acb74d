"""Small things a user reads: "on 1 rank" (not "1 ranks"), the step line's accuracy named for
what it is (the last evaluation's test accuracy), and ``ssdmpi info`` not calling the tests'
oracle (PyTorch) a missing dependency."""

import re
import subprocess
import sys

from ssdmpi.metrics import counted
from tests.conftest import run_cli
from tests.unit.test_train_cli import SMALL


def test_counts_are_singular_for_one():
    assert [counted(n, "rank") for n in (0, 1, 2)] == ["0 ranks", "1 rank", "2 ranks"]


def test_a_one_rank_run_says_one_rank_and_labels_the_step_line_s_accuracy(tmp_path):
    result = run_cli(["train", "--run-dir", "run", "--epochs", "2", "--eval-every", "1", "--log-every", "30"]
                     + [a for a in SMALL if a not in ("--eval-every", "0")], cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "1 ranks" not in out and re.search(r"^ssdmpi train: ssd \(.*\) on 1 rank, model mlp", out, re.M), out
    assert re.search(r"^ssdmpi train: done - ssd on 1 rank, model mlp", out, re.M), out
    lines = out.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    first_eval = next(i for i, line in enumerate(lines) if line.startswith("eval  step "))
    after = [line for line in lines[first_eval:] if line.startswith("step ")]
    assert steps and after and all(re.search(r"  test_acc \d+\.\d\d%", line) for line in after), after
    assert not any(re.search(r"(?<!test_)acc ", line) for line in steps), steps


def test_info_does_not_call_the_test_oracle_missing():
    """With PyTorch absent (its version made unknown), it is not among the missing dependencies."""
    code = ("import sys; import ssdmpi.info as info; real = info.version\n"
            "info.version = lambda names, module=None: None if 'torch' in names else real(names, module)\n"
            "from ssdmpi.cli import main; sys.exit(main(['info', '--device', 'cpu']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (missing,) = [line for line in lines if line.startswith("missing: ")]
    (oracle,) = [line for line in lines if line.startswith("test oracle")]
    assert "torch" not in missing and missing == "missing: none", missing
    assert oracle == "test oracle (tests and ssdmpi bench engine only): torch not installed", oracle
