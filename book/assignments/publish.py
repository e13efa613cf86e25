"""Publish notebook copies of the book into the built site and point its Colab launch links at them.

Run by ``make book`` after ``jupyter-book build``::

    python book/assignments/publish.py [--html _build/html] [--kit _build/assignments]

It writes

* ``HTML/notebooks/<doc>.ipynb`` for every chapter of ``_toc.yml`` that has code (``book/02_newsvendor``
  -> ``notebooks/book/02_newsvendor.ipynb``), converted from the MyST source with jupytext, outputs
  empty (a student runs them), and with the install cell first (:data:`INSTALL_CELL`, added only where
  the chapter does not already start with one);
* ``HTML/notebooks/assignments/<name>.ipynb``: the student notebooks of the course kit.

Colab opens notebooks from a GitHub repository, not from an arbitrary web page, so a launch link
reads ``https://colab.research.google.com/github/<org>/<repo>/blob/<branch>/notebooks/<doc>.ipynb``:
``<org>/<repo>`` is ``repository.url`` of ``_config.yml`` and ``<branch>`` is
``launch_buttons.notebooks_branch`` (default ``gh-pages``), the branch the built site is published
to (``ghp-import -n -p -f _build/html``). sphinx-book-theme builds its Colab button from the page's
*source* path (a ``.md`` that Colab cannot open); this script rewrites each such link in the built
pages to the published copy. ``tests/test_launch.py`` checks every link and its target.

``--student`` (``make book-student``, with ``--config _build/student/_config.yml``) publishes the
student edition: every exercise solution is cut from the notebook copies (:func:`strip_solutions`),
the Colab links point at the student edition's own branch (its config's ``notebooks_branch``,
``gh-pages-student``), and ``HTML/wheels/kvdro-<version>-py3-none-any.whl`` is a wheel built from
``kvdro/`` alone (:func:`build_wheel`), which the assignments' install cell downloads: a student's
machine never clones the repository with the assignment masters and never builds the kit.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path
from urllib.parse import urlparse

import jupytext
import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[2]
COLAB = "https://colab.research.google.com"

#: The first cell of a published notebook: installs kvdro (a shallow clone of the repository, so the
#: chapters find ``data/``; with the ``sharegpt`` extra that chapters 1 and 7 read) when it is missing.
#: ``{url}`` is ``repository.url`` of ``_config.yml``.
INSTALL_CELL = '''\
# Colab or any Jupyter outside a clone of kvdro: fetch the repository and install it (once, a few
# minutes). Where kvdro is already installed (a clone, CI) this cell does nothing.
import importlib.util, pathlib, subprocess, sys

if importlib.util.find_spec("kvdro") is None:
    repo = pathlib.Path.home() / "kvdro"
    if not repo.exists():
        subprocess.run(["git", "clone", "--depth", "1", "{url}", str(repo)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-e", f"{repo}[sharegpt]"], check=True)
    sys.path.insert(0, str(repo))
'''
INSTALL_GUARD = 'if importlib.util.find_spec("kvdro") is None:'


def config(root: Path = ROOT, path: Path | None = None) -> dict:
    """The book's ``_config.yml`` (or the config at ``path``, e.g. the student edition's)."""
    return yaml.safe_load(Path(path or root / "_config.yml").read_text())


#: A fenced directive of sphinx-exercise that holds a solution: ``::::{solution} label`` ... ``::::``
#: (colons or backticks, any fence length >= 3), and the gated form ``{solution-start}`` ... ``{solution-end}``.
_SOLUTION_OPEN = re.compile(r"^(?P<fence>:{3,}|`{3,})\{solution\}")
_GATE_OPEN = re.compile(r"^(:{3,}|`{3,})\{solution-start\}")
_GATE_CLOSE = re.compile(r"^(:{3,}|`{3,})\{solution-end\}")


def _strip_fenced(text: str) -> str:
    out, fence = [], None
    for line in text.splitlines(keepends=True):
        if fence is None:
            m = _SOLUTION_OPEN.match(line)
            if m:
                fence = m.group("fence")
                continue
            out.append(line)
        elif line.strip() == fence:
            fence = None
    return "".join(out)


def strip_solutions(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` without any exercise solution: fenced ``{solution}`` blocks cut from markdown cells, and
    everything between a gated ``{solution-start}`` and its ``{solution-end}`` (code cells too) dropped."""
    cells, gated = [], False
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            if not gated:
                cells.append(cell)
            continue
        kept, marker_fence = [], None
        for line in cell.source.splitlines(keepends=True):
            if marker_fence is not None:  # the rest of a gate marker's own directive, up to its closing fence
                if line.strip() == marker_fence:
                    marker_fence = None
                continue
            m_open, m_close = _GATE_OPEN.match(line), _GATE_CLOSE.match(line)
            if m_open or m_close:
                gated = bool(m_open)
                marker_fence = (m_open or m_close).group(1)
            elif not gated:
                kept.append(line)
        cell.source = _strip_fenced("".join(kept))
        if cell.source.strip():
            cells.append(cell)
    nb.cells = cells
    return nb


def build_wheel(out: Path, root: Path = ROOT) -> Path:
    """Write ``kvdro-<version>-py3-none-any.whl`` into ``out``: the files of ``kvdro/`` and the metadata of
    ``pyproject.toml`` (dependencies, extras, the ``kvdro`` command), nothing else of the repository.

    The wheel is assembled directly (a wheel is a zip with a ``.dist-info`` folder, PEP 427), so that it
    builds offline and identically on every machine. Returns its path.
    """
    import base64
    import hashlib
    import tomllib
    import zipfile

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    info = f"{name}-{version}.dist-info"
    meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {project['description']}",
            f"License: {project.get('license', '')}", f"Requires-Python: {project['requires-python']}"]
    meta += [f"Requires-Dist: {dep}" for dep in project["dependencies"]]
    for extra, deps in project.get("optional-dependencies", {}).items():
        meta.append(f"Provides-Extra: {extra}")
        meta += [f'Requires-Dist: {dep}; extra == "{extra}"' for dep in deps]
    files = {f"{info}/METADATA": "\n".join(meta) + "\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: kvdro-publish\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{info}/top_level.txt": f"{name}\n"}
    scripts = project.get("scripts", {})
    if scripts:
        files[f"{info}/entry_points.txt"] = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
    sources = sorted(p for p in (root / "kvdro").rglob("*") if p.is_file() and "__pycache__" not in p.parts
                     and p.suffix not in (".pyc", ".so"))
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        entries = [(p.relative_to(root).as_posix(), p.read_bytes()) for p in sources]
        entries += [(k, v.encode()) for k, v in files.items()]
        for arcname, data in entries:
            zi = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, data, compress_type=zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arcname},sha256={digest},{len(data)}")
        record.append(f"{info}/RECORD,,")
        zi = zipfile.ZipInfo(f"{info}/RECORD", date_time=(2026, 1, 1, 0, 0, 0))
        zi.external_attr = 0o644 << 16
        zf.writestr(zi, "\n".join(record) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    return wheel


def repository(cfg: dict) -> tuple[str, str, str]:
    """(url, org, repo) of ``repository.url``; a ValueError if it is not a GitHub address."""
    url = str(cfg.get("repository", {}).get("url", "")).rstrip("/")
    parsed = urlparse(url)
    parts = [p for p in parsed.path.split("/") if p]
    if parsed.netloc != "github.com" or len(parts) != 2:
        raise ValueError(f"_config.yml repository.url must be https://github.com/<org>/<repo> for Colab, got {url!r}")
    return url, parts[0], parts[1].removesuffix(".git")


def notebooks_branch(cfg: dict) -> str:
    return str(cfg.get("launch_buttons", {}).get("notebooks_branch", "gh-pages"))


def colab_link(cfg: dict, target: str) -> str:
    """The Colab address of a published notebook ``target`` (relative to the site, e.g. ``notebooks/x.ipynb``)."""
    _, org, repo = repository(cfg)
    return f"{COLAB}/github/{org}/{repo}/blob/{notebooks_branch(cfg)}/{target}"


def chapters(root: Path = ROOT) -> list[str]:
    """Doc names of ``_toc.yml`` (``book/02_newsvendor``) whose source has code cells."""
    docs = re.findall(r"file:\s*(\S+)", (root / "_toc.yml").read_text())
    return [d for d in docs if "{code-cell}" in (root / f"{d}.md").read_text()]


def with_install_cell(nb: nbformat.NotebookNode, url: str) -> nbformat.NotebookNode:
    """``nb`` with :data:`INSTALL_CELL` as its first code cell, unless a code cell already guards an install."""
    if any(c.cell_type == "code" and INSTALL_GUARD in c.source for c in nb.cells):
        return nb
    nb.cells.insert(0, nbformat.v4.new_code_cell(INSTALL_CELL.replace("{url}", url)))
    return nb


def publish(html: Path, kit: Path, root: Path = ROOT, *, student: bool = False,
            cfg_path: Path | None = None) -> dict[str, Path]:
    """Write the notebook copies under ``html/notebooks`` (``student``: without solutions, and the kvdro
    wheel under ``html/wheels``); return {site-relative path: file}."""
    cfg = config(root, cfg_path)
    url, _, _ = repository(cfg)
    out = html / "notebooks"
    if out.exists():
        shutil.rmtree(out)
    written: dict[str, Path] = {}
    for doc in chapters(root):
        nb = jupytext.read(root / f"{doc}.md")
        if student:
            nb = strip_solutions(nb)
        nb = with_install_cell(nb, url)
        nb.metadata.pop("jupytext", None)
        nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
        target = out / f"{doc}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        written[f"notebooks/{doc}.ipynb"] = target
    for handout in sorted(kit.glob("*/student/*.ipynb")):
        target = out / "assignments" / handout.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(handout, target)
        written[f"notebooks/assignments/{handout.name}"] = target
    if student:
        wheels = html / "wheels"
        if wheels.exists():
            shutil.rmtree(wheels)
        wheel = build_wheel(wheels, root)
        written[f"wheels/{wheel.name}"] = wheel
    return written


def rewrite_launch_links(html: Path, root: Path = ROOT, cfg_path: Path | None = None) -> int:
    """Point each chapter page's Colab button (the theme's, to the ``.md`` source) at the published copy.

    Returns the number of links rewritten.
    """
    cfg = config(root, cfg_path)
    _, org, repo = repository(cfg)
    branch = str(cfg.get("repository", {}).get("branch", "main"))
    count = 0
    for doc in chapters(root):
        page = html / f"{doc}.html"
        if not page.exists():
            continue
        text = page.read_text(encoding="utf-8")
        theme = f"{COLAB}/github/{org}/{repo}/blob/{branch}/{doc}.md"
        n = text.count(theme)
        if n:
            page.write_text(text.replace(theme, colab_link(cfg, f"notebooks/{doc}.ipynb")), encoding="utf-8")
            count += n
    return count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    parser.add_argument("--kit", type=Path, default=ROOT / "_build" / "assignments")
    parser.add_argument("--config", type=Path, default=None, help="the book config (default _config.yml)")
    parser.add_argument("--student", action="store_true", help="the student edition: no solutions, and the wheel")
    args = parser.parse_args(argv)
    written = publish(args.html, args.kit, student=args.student, cfg_path=args.config)
    links = rewrite_launch_links(args.html, cfg_path=args.config)
    print(f"published {len(written)} notebooks under {args.html / 'notebooks'}; {links} Colab links point at them")


if __name__ == "__main__":
    main()
