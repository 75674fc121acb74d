"""The user-facing pages: no development log in them, links into BENCHMARKS.md that resolve,
and a conda environment whose GPU part is optional."""

import re

import pytest
import yaml

from ssdmpi.bench.report import anchor
from tests.conftest import ROOT

# The pages a user reads that must not read like a development log.
USER_DOCS = ("BENCHMARKS.md", "CHANGELOG.md", "README.md", "docs/USAGE.md", "docs/GPU.md", "docs/CLUSTER.md",
             "docs/ALGORITHM.md", "docs/ACCURACY.md", "docs/PERIOD_RULE.md", "docs/API.md", "jobs/README.md")


def line_of(text: str, match) -> int:
    return text[:match.start()].count("\n") + 1


@pytest.mark.parametrize("name", USER_DOCS)
def test_no_issue_numbers_or_development_log(name):
    text = (ROOT / name).read_text(encoding="utf-8")
    for pattern in (r"\bissues? #?\d+", r"Must show", r"\bworkplace\b", r"\bsession\b", r"\bhelpers?\b",
                    r"carry list", r"device run recipe"):
        found = re.search(pattern, text, re.I)
        assert found is None, f"{name}:{line_of(text, found)}: {found.group(0)!r}"


@pytest.mark.parametrize("name", USER_DOCS)
def test_links_into_benchmarks_name_its_sections_by_heading(name):
    headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", (ROOT / "BENCHMARKS.md").read_text(), re.M)}
    text = (ROOT / name).read_text(encoding="utf-8")
    numbered = re.search(r"BENCHMARKS\.md,?\s+sections?\s+\d", text)
    assert numbered is None, f"{name}:{line_of(text, numbered)}: the page has no numbered sections"
    for target in re.findall(r"BENCHMARKS\.md#([^)\s]+)\)", text):
        assert target in headings, f"{name}: no heading of BENCHMARKS.md has the anchor #{target}"


def test_the_conda_environment_installs_no_cupy_and_the_gpu_file_adds_it():
    base = yaml.safe_load((ROOT / "environment.yml").read_text())
    gpu = yaml.safe_load((ROOT / "environment-gpu.yml").read_text())

    def names(env):
        return [str(d).split("=")[0].split(">")[0].strip() for d in env["dependencies"] if isinstance(d, str)]

    assert not {"cupy", "cuda-version", "cudatoolkit"} & set(names(base)), names(base)
    assert {"cupy", "cuda-version"} <= set(names(gpu))
    assert gpu["name"] == base["name"] and gpu["channels"] == base["channels"]
    usage = (ROOT / "docs" / "USAGE.md").read_text()         # installing on a cluster
    assert "conda env update -n ssdmpi -f environment-gpu.yml" in usage
