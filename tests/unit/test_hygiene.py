"""Project-wide rules: the linter is clean and no function in ssdmpi/ is longer than 80 lines."""

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 80


def _ruff() -> list | None:
    exe = pathlib.Path(sys.executable).parent / "ruff"
    if exe.exists():
        return [str(exe)]
    if shutil.which("ruff"):
        return ["ruff"]
    try:
        import ruff  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "ruff"]


def test_ruff_check_is_clean():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install 'ssdmpi[test]')")
    result = subprocess.run(ruff + ["check", "--output-format", "concise", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def long_functions(root: pathlib.Path, limit: int = MAX_FUNCTION_LINES) -> list:
    """``["path:line name (N lines)", ...]`` for every function of ``root``'s .py files longer than ``limit``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_the_length_check_finds_a_long_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (package / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n")
    assert long_functions(package) == [f"pkg/m.py:5 long ({MAX_FUNCTION_LINES + 1} lines)"]


def test_no_function_in_ssdmpi_is_longer_than_80_lines():
    assert long_functions(ROOT / "ssdmpi") == []
