"""Build the course kit: student notebooks and otter-grader autograders from the assignment masters.

For every master ``book/assignments/<name>.md`` (a jupytext MyST notebook in otter-grader's
assignment format) this writes, under ``OUT/<name>/`` (default ``_build/assignments``)::

    master/<name>.ipynb                 the master converted to a notebook (what ``otter assign`` reads)
    student/<name>.ipynb                solutions and hidden tests stripped, ``grader.check`` cells kept
    autograder/<name>.ipynb             the solutions notebook
    autograder/<name>-autograder.zip    the autograder (otter's timestamped zip, renamed to a stable name)
    student/<name>-written.pdf          the written (manually graded) questions only, blank: the template
                                        to create the Gradescope assignment's outline from
    autograder/<name>-written-solutions.pdf   the same questions with model answers and rubrics, for graders

and ``OUT/index.json`` (questions and points of every assignment). Every autograder zip names the
grading plugin ``kit_grade.KitGrader`` and carries it at its root with the pre-grading pass and the
guard (``kit_grade.py``, ``kit_static.py``, ``kit_guard.py``) and ``kit_handout.json`` (the handout's
own cells): grading runs out of the student's kernel. Grade one submission without Docker with
``python book/assignments/kit_grade.py -a autograder/<name>-autograder.zip submission.ipynb``.

The autograder zip carries the ``kvdro`` package itself (``files/kvdro``, which otter copies next to
the submission, so ``import kvdro`` works in a grading container where kvdro is not installed) and a
``requirements.txt`` with kvdro's pinned dependencies, so that ``otter grade`` can build its Docker
image (Python 3.11). The real traces are not in the zip: set ``KVDRO_DATA_DIR`` where grading runs,
or let ``kvdro.datasets`` download them.

The PDFs keep only the cells otter marks as manually graded (``otter export``'s filtering) and are
printed by headless Chromium from nbconvert's HTML with a local MathJax,
so they build offline with no LaTeX. Without Chromium (``apt-get install chromium``) they are left
out with a warning; ``--no-pdfs`` leaves them out on purpose.

Usage::

    python book/assignments/build.py [--out DIR] [--src DIR] [--no-pdfs] [NAME ...]

``--src`` builds masters kept elsewhere (e.g. a private variant of an assignment with other
instances, for a graded course: the masters in this public repository contain their solutions).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jupytext
import nbformat
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_OUT = ROOT / "_build" / "assignments"
#: The graders' helper module that every autograder zip carries (hidden tests import it).
GUARD = HERE / "kit_guard.py"
#: The grading plugin, the pre-grading pass and the guard: at the root of every autograder zip (where
#: Gradescope's ``run_otter.py`` and ``kit_grade.py``'s command line import them), never in the
#: submission's folder.
KIT_MODULES = (HERE / "kit_grade.py", HERE / "kit_static.py", GUARD)
#: Assignments built at once (each by its own otter and Chromium subprocesses).
BUILD_WORKERS = 2

_FENCE = re.compile(r"```otter\n(.*?)\n```", re.DOTALL)


def masters(src: Path = HERE) -> dict[str, Path]:
    """Every assignment master ``a<N>_<topic>.md`` in ``src`` (default: this folder), by name."""
    return {p.stem: p for p in sorted(Path(src).glob("a[0-9]*_*.md"))}


def _config_blocks(text: str) -> list[dict]:
    """The YAML of every ```otter fenced block of a master, in order."""
    return [yaml.safe_load(block) or {} for block in _FENCE.findall(text)]


def questions(master: Path) -> list[dict]:
    """The questions of a master: name, points and whether they are graded by hand (``manual``)."""
    out = []
    for block in _FENCE.findall(master.read_text()):
        lines = block.splitlines()
        if lines and re.match(r"#\s*BEGIN\s+QUESTION", lines[0], re.IGNORECASE):
            cfg = yaml.safe_load("\n".join(lines[1:])) or {}
            out.append({"name": cfg["name"], "points": cfg.get("points", 1), "manual": bool(cfg.get("manual", False))})
    return out


def _requirements() -> list[str]:
    """kvdro's direct dependencies (pyproject.toml) at the exact versions of ``constraints.txt``, for the
    grading image of ``otter grade`` (the package metadata gives ranges; the image must be reproducible)."""
    from packaging.requirements import Requirement

    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[norm(name.strip())] = version.strip()
    out = []
    for text in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        name = Requirement(text).name
        out.append(f"{name}=={pins[norm(name)]}" if norm(name) in pins else text)
    return out


def _to_notebook(master: Path) -> nbformat.NotebookNode:
    """Read a MyST master with jupytext and add the Docker-grading settings to its assignment config."""
    nb = jupytext.read(master)
    for cell in nb.cells:
        source = cell.source.strip()
        if cell.cell_type == "markdown" and source.startswith("```otter") and "ASSIGNMENT CONFIG" in source:
            body = _FENCE.match(source)
            if body is None or body.end() != len(source):
                raise ValueError(f"{master}: the ASSIGNMENT CONFIG block must be a markdown cell of its own")
            lines = body.group(1).splitlines()
            config = yaml.safe_load("\n".join(lines[1:])) or {}
            if config.get("name") != master.stem:
                raise ValueError(f"{master}: ASSIGNMENT CONFIG name must be {master.stem!r}, got {config.get('name')!r}")
            if not (config.get("generate") or {}).get("show_hidden"):
                raise ValueError(f"{master}: generate.show_hidden must be true (students see the hidden tests' "
                                 "results once grades are published)")
            config["requirements"] = "requirements.txt"
            config["autograder_files"] = sorted(set(config.get("autograder_files", [])) | {"kvdro"})
            config["plugins"] = ["kit_grade.KitGrader"]  # grading out of the student's kernel (kit_grade.py)
            cell.source = "```otter\n# ASSIGNMENT CONFIG\n" + yaml.safe_dump(config, sort_keys=False) + "```"
            return nb
    raise ValueError(f"{master}: no ```otter block starting with '# ASSIGNMENT CONFIG'")


CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str | None:
    """The path of a Chromium-like browser on PATH, or None."""
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def _local_mathjax() -> str:
    """A file URL of the MathJax 2.7 that the ``jupyter-server-mathjax`` wheel ships (the book uses it too)."""
    import jupyter_server_mathjax

    js = Path(jupyter_server_mathjax.__file__).parent / "static" / "MathJax.js"
    return js.as_uri() + "?config=TeX-AMS-MML_HTMLorMML-full,Safe"


#: MathJax settings of the written-question PDFs, before MathJax loads: the local MathJax ships the
#: STIX-Web fonts only (the book's own setting, ``book/_ext``). nbconvert leaves HTML-CSS at its default
#: TeX web font, which is missing, and the fallback set accents apart from their letters: the hat of
#: xi-hat printed as a stray "^" beside the xi.
MATHJAX_FONTS = (
    '<script type="text/x-mathjax-config">MathJax.Hub.Config({"HTML-CSS": {availableFonts: [], '
    'preferredFont: null, webFont: "STIX-Web", imageFont: null}, SVG: {font: "STIX-Web"}});</script>'
)


def written_html(notebook: Path) -> str:
    """The manually graded questions of ``notebook`` (otter's filtering) as one HTML page with a local MathJax."""
    import nbconvert
    from otter.export.exporters.base_exporter import BaseExporter

    nb = BaseExporter.load_notebook(str(notebook), filtering=True, pagebreaks=True)
    if not nb.cells:
        raise ValueError(f"{notebook}: no manually graded question to export")
    questions = 0
    for cell in nb.cells:  # an accent on a bare command (\hat\xi) is read the same braced; braced is safer
        if cell.cell_type == "markdown":
            cell.source = re.sub(r"\\(hat|bar|tilde)\\([A-Za-z]+)", r"\\\1{\\\2}", cell.source)
            if "<!-- BEGIN QUESTION -->" in cell.source:
                # one question per page (Gradescope's template): otter's page breaks are LaTeX-only
                if questions:
                    cell.source = '<div style="break-before: page; page-break-before: always"></div>\n\n' + cell.source
                questions += 1
    exporter = nbconvert.HTMLExporter(template_name="classic", exclude_input_prompt=True, exclude_output_prompt=True)
    exporter.mathjax_url = _local_mathjax()
    body, _ = exporter.from_notebook_node(nb)
    head = body.index("<head>") + len("<head>")
    body = body[:head] + MATHJAX_FONTS + body[head:]
    return body.replace("</head>", "<style>body { margin: 0 1cm; }</style></head>", 1)


def written_pdf(notebook: Path, pdf: Path, browser: str) -> Path:
    """Print the manually graded questions of ``notebook`` (otter's filtering) to ``pdf`` with ``browser``."""
    body = written_html(notebook)
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / f"{notebook.stem}.html"
        html.write_text(body, encoding="utf-8")
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
               "--disable-background-networking", "--allow-file-access-from-files", f"--user-data-dir={tmp}/profile",
               "--virtual-time-budget=5000", "--no-pdf-header-footer", f"--print-to-pdf={pdf}", html.as_uri()]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if run.returncode != 0 or not pdf.is_file() or not pdf.read_bytes().startswith(b"%PDF"):
        raise RuntimeError(f"Chromium did not print {pdf}:\n{run.stderr[-2000:]}")
    return pdf


INSTALL_GUARD = 'if importlib.util.find_spec("kvdro") is None:'
#: The line of a master's install cell that the build replaces by the assignment's public tests.
PUBLIC_TESTS_LINE = "PUBLIC_TESTS = {}  # the kit's build writes this assignment's public tests here"
#: Where the student edition publishes the kvdro wheel (kvdro/ only; no assignment master in it):
#: the branch ``notebooks_branch_student`` of the repository, see ``book/assignments/publish.py``.
STUDENT_BRANCH = "gh-pages-student"


def wheel_name() -> str:
    """The file name of the kvdro wheel (``kvdro-<version>-py3-none-any.whl``)."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"kvdro-{version}-py3-none-any.whl"


def wheel_url(repo_url: str, branch: str = STUDENT_BRANCH) -> str:
    """The raw address of the wheel that the student edition publishes (``wheels/<wheel>`` on ``branch``)."""
    org, repo = repo_url.rstrip("/").removeprefix("https://github.com/").split("/")[:2]
    return f"https://raw.githubusercontent.com/{org}/{repo.removesuffix('.git')}/{branch}/wheels/{wheel_name()}"


def _install_cell_first(notebook: Path) -> None:
    """Move the master's install cell (guarded by :data:`INSTALL_GUARD`) before otter's ``import otter``
    cell, so that a student notebook opened on Colab installs kvdro and otter-grader before using them,
    and write the assignment's public tests into it (:data:`PUBLIC_TESTS_LINE`): the student's machine
    never builds the kit and never sees a master."""
    nb = nbformat.read(notebook, as_version=4)
    found = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and INSTALL_GUARD in c.source]
    if found:
        cell = nb.cells.pop(found[0])
        tests = dict(sorted(nb.metadata.get("otter", {}).get("tests", {}).items()))
        if PUBLIC_TESTS_LINE in cell.source:
            body = "PUBLIC_TESTS = {\n" + "".join(f"        {k!r}: {v!r},\n" for k, v in tests.items()) + "    }"
            cell.source = cell.source.replace(PUBLIC_TESTS_LINE, body)
        nb.cells.insert(0, cell)
        nbformat.write(nb, notebook)


def _add_grader(zip_path: Path, student: Path, solutions: Path) -> None:
    """Put the grading plugin, the pass, the guard and the handout's cells (``kit_handout.json``) at the
    root of the autograder zip (``kit_grade.py`` says what each does)."""
    import zipfile

    sys.path.insert(0, str(HERE))
    try:
        import kit_grade
    finally:
        sys.path.remove(str(HERE))
    hand = kit_grade.handout(nbformat.read(student, as_version=4), nbformat.read(solutions, as_version=4))
    with zipfile.ZipFile(zip_path, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        for module in KIT_MODULES:
            zf.write(module, module.name)
        zf.writestr(kit_grade.HANDOUT_FILE, json.dumps(hand, indent=1))


def build_one(name: str, master: Path, out: Path, pdfs: bool = True) -> dict:
    """Build one assignment into ``out/name``; return its summary (paths, questions, points)."""
    target = out / name
    if target.exists():
        shutil.rmtree(target)
    src = target / "master"
    src.mkdir(parents=True)
    nbformat.write(_to_notebook(master), src / f"{name}.ipynb")
    (src / "requirements.txt").write_text("\n".join(_requirements()) + "\n")
    shutil.copytree(ROOT / "kvdro", src / "kvdro", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for module in KIT_MODULES:  # otter assign imports the plugin named in the config
        shutil.copyfile(module, src / module.name)
    cmd = [sys.executable, "-m", "otter", "assign", "--no-pdfs", str(src / f"{name}.ipynb"), str(target)]
    run = subprocess.run(cmd, cwd=src, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"otter assign failed for {name}:\n{run.stdout}\n{run.stderr}")
    zips = sorted((target / "autograder").glob(f"{name}-autograder_*.zip"))
    if len(zips) != 1:
        raise RuntimeError(f"otter assign wrote {len(zips)} autograder zips for {name}, expected 1")
    zip_path = target / "autograder" / f"{name}-autograder.zip"
    zips[0].rename(zip_path)
    _install_cell_first(target / "student" / f"{name}.ipynb")
    _add_grader(zip_path, target / "student" / f"{name}.ipynb", target / "autograder" / f"{name}.ipynb")
    shutil.rmtree(src / "kvdro")
    for module in KIT_MODULES:
        (src / module.name).unlink()
    qs = questions(master)
    written = []
    browser = chromium() if pdfs and any(q["manual"] for q in qs) else None
    if pdfs and browser is None and any(q["manual"] for q in qs):
        print(f"{name}: no Chromium on PATH, so no PDF of the written questions (apt-get install chromium)", file=sys.stderr)
    if browser:
        for nb, pdf in ((target / "student" / f"{name}.ipynb", target / "student" / f"{name}-written.pdf"),
                        (target / "autograder" / f"{name}.ipynb", target / "autograder" / f"{name}-written-solutions.pdf")):
            written.append(str(written_pdf(nb, pdf, browser).relative_to(out)))
    return {
        "name": name,
        "master": str(master.relative_to(ROOT)) if master.is_relative_to(ROOT) else str(master),
        "student": f"{name}/student/{name}.ipynb",
        "autograder": f"{name}/autograder/{name}-autograder.zip",
        "questions": qs,
        "autograded_points": sum(q["points"] for q in qs if not q["manual"]),
        "manual_points": sum(q["points"] for q in qs if q["manual"]),
        "pdfs": written,
    }


def build(out: Path = DEFAULT_OUT, names: list[str] | None = None, src: Path = HERE, pdfs: bool = True) -> list[dict]:
    """Build the named assignments of ``src`` (default: all) into ``out``; write ``out/index.json``."""
    available = masters(src)
    chosen = names or list(available)
    unknown = sorted(set(chosen) - set(available))
    if unknown:
        raise ValueError(f"names: unknown assignment(s) {unknown}; available: {sorted(available)}")
    out.mkdir(parents=True, exist_ok=True)
    # each assignment is built by its own subprocesses (otter assign, Chromium) into its own folder
    with ThreadPoolExecutor(BUILD_WORKERS) as pool:
        summary = list(pool.map(lambda n: build_one(n, available[n], out, pdfs), chosen))
    index = out / "index.json"
    old = {a["name"]: a for a in json.loads(index.read_text())} if index.exists() and names else {}
    old.update({a["name"]: a for a in summary})
    index.write_text(json.dumps([old[n] for n in sorted(old)], indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="assignments to build (default: all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default _build/assignments)")
    parser.add_argument("--src", type=Path, default=HERE, help="folder of masters (default book/assignments)")
    parser.add_argument("--no-pdfs", action="store_true", help="skip the PDFs of the written questions")
    args = parser.parse_args(argv)
    for a in build(args.out.resolve(), args.names or None, args.src.resolve(), pdfs=not args.no_pdfs):
        print(f"{a['name']}: {a['autograded_points']} autograded + {a['manual_points']} written points "
              f"-> {args.out / a['student']}, {args.out / a['autograder']}"
              + (f", {len(a['pdfs'])} PDFs" if a["pdfs"] else ""))


if __name__ == "__main__":
    main()
