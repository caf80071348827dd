"""The tested torch range is stated once, `dlcourse.backends.TESTED_TORCH` (what `dlcourse info`
compares against); the files that repeat it for pip and for readers must agree with it."""

import re
from pathlib import Path

from dlcourse.backends import TESTED_TORCH

ROOT = Path(__file__).resolve().parent.parent
OLDEST, NEWEST = TESTED_TORCH


def test_constraints_pin_the_oldest_tested_torch():
    # The whole suite runs on the pin (.ci/run installs with -c constraints.txt).
    pins = re.findall(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pins == [OLDEST], pins


def test_pyproject_accepts_the_tested_range_without_a_cap():
    # A cap would make `pip install -e .` replace a student's newer torch.
    requirements = re.findall(r'^\s*"(torch\b[^"]*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    major_minor = ".".join(OLDEST.split(".")[:2])
    assert requirements == [f"torch>={major_minor}"], requirements


def test_readme_names_both_tested_releases():
    readme = (ROOT / "README.md").read_text()
    assert f"- **torch {OLDEST}**, the pin in `constraints.txt`" in readme
    assert f"- **The newest torch on PyPI** ({NEWEST} when this was written" in readme
