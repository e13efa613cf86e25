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


def config(root: Path = ROOT) -> dict:
    return yaml.safe_load((root / "_config.yml").read_text())


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


def publish(html: Path, kit: Path, root: Path = ROOT) -> dict[str, Path]:
    """Write the notebook copies under ``html/notebooks``; return {site-relative path: file}."""
    cfg = config(root)
    url, _, _ = repository(cfg)
    out = html / "notebooks"
    if out.exists():
        shutil.rmtree(out)
    written: dict[str, Path] = {}
    for doc in chapters(root):
        nb = with_install_cell(jupytext.read(root / f"{doc}.md"), url)
        nb.metadata.pop("jupytext", None)
        nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
        target = out / f"{doc}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        written[f"notebooks/{doc}.ipynb"] = target
    for student in sorted(kit.glob("*/student/*.ipynb")):
        target = out / "assignments" / student.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(student, target)
        written[f"notebooks/assignments/{student.name}"] = target
    return written


def rewrite_launch_links(html: Path, root: Path = ROOT) -> int:
    """Point each chapter page's Colab button (the theme's, to the ``.md`` source) at the published copy.

    Returns the number of links rewritten.
    """
    cfg = config(root)
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
    args = parser.parse_args(argv)
    written = publish(args.html, args.kit)
    links = rewrite_launch_links(args.html)
    print(f"published {len(written)} notebooks under {args.html / 'notebooks'}; {links} Colab links point at them")


if __name__ == "__main__":
    main()
