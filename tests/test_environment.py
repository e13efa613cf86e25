"""The conda environment (Binder) and the pip package pin the same versions of the same packages."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

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


def pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra, items in project["optional-dependencies"].items():
        reqs += items
    return _pins(reqs, "pyproject.toml")


def environment_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml: expected exactly one pip: section"
    return _pins(pip_sections[0], "environment.yml")


def constraint_pins() -> dict[str, str]:
    lines = [ln for ln in (ROOT / "constraints.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    return _pins(lines, "constraints.txt")


def test_environment_yml_matches_pyproject():
    py, env = pyproject_pins(), environment_pins()
    assert sorted(set(py) - set(env)) == [], "in pyproject.toml but not environment.yml"
    assert sorted(set(env) - set(py)) == [], "in environment.yml but not pyproject.toml"
    assert {k: v for k, v in py.items() if env[k] != v} == {}, "versions differ"


def test_constraints_agree_with_direct_pins():
    py, lock = pyproject_pins(), constraint_pins()
    assert {k: (v, lock.get(k)) for k, v in py.items() if lock.get(k) != v} == {}


def test_environment_python_matches_requires_python():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python=")]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert python == ["python=3.11"] and requires == ">=3.11"
