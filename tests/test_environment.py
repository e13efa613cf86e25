"""The package's dependency ranges, the exact pins of constraints.txt and the conda environment agree.

pyproject.toml gives *ranges* for the package's direct dependencies (so that `pip install kvdro` on
Colab keeps a preinstalled numpy or pandas that fits) and exact pins for the extras; constraints.txt
pins the whole tree for CI and the book; environment.yml (Binder) pins the same versions as
constraints.txt. Every range must admit its constraints.txt pin.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(requirements: list[str], where: str) -> dict[str, str]:
    pins = {}
    for req in requirements:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;]+)\s*", req)
        assert match, f"{where}: {req!r} is not pinned with == (the book must be reproducible)"
        pins[_normalise(match.group(1))] = match.group(2)
    return pins


def pyproject_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for items in project["optional-dependencies"].values():
        reqs += items
    out = {}
    for text in reqs:
        req = Requirement(text)
        assert req.specifier, f"pyproject.toml: {text!r} has no version range"
        out[_normalise(req.name)] = req
    return out


def environment_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml: expected exactly one pip: section"
    return _pins(pip_sections[0], "environment.yml")


def constraint_pins() -> dict[str, str]:
    lines = [ln for ln in (ROOT / "constraints.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    return _pins(lines, "constraints.txt")


def test_environment_yml_lists_the_pyproject_packages():
    py, env = pyproject_requirements(), environment_pins()
    assert sorted(set(py) - set(env)) == [], "in pyproject.toml but not environment.yml"
    assert sorted(set(env) - set(py)) == [], "in environment.yml but not pyproject.toml"


def test_every_range_admits_the_constraints_pin():
    py, lock = pyproject_requirements(), constraint_pins()
    missing = sorted(k for k in py if k not in lock)
    assert missing == [], f"no constraints.txt pin for {missing}"
    bad = {k: (str(req.specifier), lock[k]) for k, req in py.items() if not req.specifier.contains(lock[k], prereleases=True)}
    assert bad == {}, f"constraints.txt pins outside the pyproject.toml range: {bad}"


def test_environment_yml_pins_equal_constraints():
    env, lock = environment_pins(), constraint_pins()
    assert {k: (v, lock.get(k)) for k, v in env.items() if lock.get(k) != v} == {}


def test_package_ranges_admit_colab_like_versions():
    """The direct dependencies are ranges, not pins: numpy 2.0 and pandas 2.2 (a Colab runtime of 2025)
    fit, so pip keeps them; the extras stay exact (the kit's otter-grader==7.0.0 included)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {_normalise(Requirement(t).name): Requirement(t) for t in project["dependencies"]}
    assert deps["numpy"].specifier.contains("2.0.2") and deps["pandas"].specifier.contains("2.2.2")
    assert not any(str(r.specifier).startswith("==") for r in deps.values()), "a direct dependency is pinned exactly"
    assert "otter-grader==7.0.0" in project["optional-dependencies"]["dev"]


def test_environment_python_matches_requires_python():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python=")]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert python == ["python=3.11"] and requires == ">=3.11"
