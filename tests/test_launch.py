"""Students running in minutes: notebook copies in the site, Colab launch links that reach them.

``make book`` builds the site and then runs ``book/assignments/publish.py``, which writes an
``.ipynb`` copy of every chapter with code and of every student notebook under
``_build/html/notebooks/`` and points the theme's Colab buttons at them. Unit tests check the
copies (install cell first, guarded; nothing else changed) on the real sources; the tests on the
built site check every launch link and its target, and that no university hub is linked.

Without a built book the site tests skip, unless ``KVDRO_REQUIRE_BOOK=1`` (set by the Makefile),
when they fail; ``KVDRO_BOOK_HTML`` points them at another build.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

import jupytext
import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("KVDRO_BOOK_HTML") or ROOT / "_build" / "html")

_spec = importlib.util.spec_from_file_location("kvdro_publish", ROOT / "book" / "assignments" / "publish.py")
publish = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(publish)

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPO_URL = CONFIG["repository"]["url"].rstrip("/")
ASSIGNMENTS = sorted(p.stem for p in (ROOT / "book" / "assignments").glob("a[0-9]*_*.md"))


# ----------------------------------------------------------------------------------------- unit
def test_config_has_colab_and_no_university_hub():
    buttons = CONFIG["launch_buttons"]
    assert buttons.get("colab_url") == "https://colab.research.google.com"
    assert "datahub.berkeley.edu" not in (ROOT / "_config.yml").read_text()
    assert not buttons.get("jupyterhub_url"), "a JupyterHub button is opt-in (see the comment in _config.yml)"
    _, org, repo = publish.repository(CONFIG)
    assert REPO_URL == f"https://github.com/{org}/{repo}"
    assert publish.colab_link(CONFIG, "notebooks/book/02_newsvendor.ipynb") == (
        f"https://colab.research.google.com/github/{org}/{repo}/blob/{buttons['notebooks_branch']}/notebooks/book/02_newsvendor.ipynb"
    )


def test_repository_must_be_github():
    with pytest.raises(ValueError, match="repository.url"):
        publish.repository({"repository": {"url": "https://example.org/kvdro"}})


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    html = tmp_path_factory.mktemp("html")
    kit = tmp_path_factory.mktemp("kit")
    for name in ASSIGNMENTS:  # stand-ins for the kit's student notebooks (the real ones need `make assignments`)
        student = kit / name / "student" / f"{name}.ipynb"
        student.parent.mkdir(parents=True)
        nbformat.write(jupytext.read(ROOT / "book" / "assignments" / f"{name}.md"), student)
    return html, publish.publish(html, kit)


def test_every_chapter_with_code_and_every_assignment_is_published(published):
    html, written = published
    docs = re.findall(r"(?:root|file):\s*(\S+)", (ROOT / "_toc.yml").read_text())  # the root page is a chapter too
    with_code = [d for d in docs if "{code-cell}" in (ROOT / f"{d}.md").read_text()]
    assert len(with_code) >= 8, with_code
    assert sorted(written) == sorted([f"notebooks/{d}.ipynb" for d in with_code]
                                     + [f"notebooks/assignments/{a}.ipynb" for a in ASSIGNMENTS])
    for doc in with_code:
        nb = nbformat.read(html / "notebooks" / f"{doc}.ipynb", as_version=4)
        nbformat.validate(nb)
        source = jupytext.read(ROOT / f"{doc}.md")
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        original = [c.source for c in source.cells if c.cell_type == "code"]
        first = code[0]
        assert publish.INSTALL_GUARD in first and f'"{REPO_URL}"' in first, f"{doc}: first code cell\n{first}"
        # nothing else changed: the chapter's own code cells follow, in order
        assert code[len(code) - len(original):] == original, doc
        assert len(code) - len(original) in (0, 1), doc


def test_install_cell_does_nothing_where_kvdro_is_installed():
    env: dict = {}
    exec(compile(publish.INSTALL_CELL.replace("{url}", REPO_URL), "<install cell>", "exec"), env)
    assert "repo" not in env, "the install cell ran although kvdro is installed"


def test_rewrite_points_the_theme_colab_button_at_the_copy(tmp_path):
    # the address sphinx-book-theme builds: {colab_url}/github/{org}/{repo}/blob/{branch}/{path of the source}
    _, org, repo = publish.repository(CONFIG)
    theme = f"https://colab.research.google.com/github/{org}/{repo}/blob/{CONFIG['repository']['branch']}/book/02_newsvendor.md"
    page = tmp_path / "book" / "02_newsvendor.html"
    page.parent.mkdir()
    page.write_text(f'<a href="{theme}" class="btn dropdown-item" title="Launch on Colab">Colab</a>')
    assert publish.rewrite_launch_links(tmp_path) == 1
    assert publish.colab_link(CONFIG, "notebooks/book/02_newsvendor.ipynb") in page.read_text()
    assert ".md" not in page.read_text()


# ----------------------------------------------------------------------------------------- built site
def built() -> Path:
    if not (HTML / "index.html").exists():
        if os.environ.get("KVDRO_REQUIRE_BOOK") == "1":
            pytest.fail(f"no built book at {HTML}: run `make book` first")
        pytest.skip(f"no built book at {HTML}: run `make book` first")
    return HTML


def _links(page: Path) -> list[str]:
    return re.findall(r'href="([^"]+)"', page.read_text(encoding="utf-8"))


def test_built_chapters_launch_on_colab_from_the_published_copy():
    html = built()
    problems = []
    for doc in publish.chapters():
        page = html / f"{doc}.html"
        links = _links(page)
        # the page's own launch link(s); the teaching page also links each assignment's copy on Colab
        # (checked in the next test), which is not a launch link of the page
        colab = [u for u in links if "colab.research.google.com" in u and "/notebooks/assignments/" not in u]
        want = publish.colab_link(CONFIG, f"notebooks/{doc}.ipynb")
        if colab != [want]:
            problems.append(f"{doc}: Colab links {colab}, want [{want}]")
        target = html / "notebooks" / f"{doc}.ipynb"
        if not target.is_file():
            problems.append(f"{doc}: {target} was not published")
            continue
        nb = nbformat.read(target, as_version=4)
        first = next(c.source for c in nb.cells if c.cell_type == "code")
        if publish.INSTALL_GUARD not in first:
            problems.append(f"{doc}: the published notebook does not start with the install cell")
        binder = [u for u in links if "mybinder.org" in u]
        _, org, repo = publish.repository(CONFIG)
        if not binder or any(f"/gh/{org}/{repo}/" not in u for u in binder):
            problems.append(f"{doc}: Binder links {binder} do not name {org}/{repo}")
        if any("datahub.berkeley.edu" in u or "hub/user-redirect" in u for u in links):
            problems.append(f"{doc}: links a JupyterHub")
    assert not problems, "\n".join(problems)


def test_built_teaching_page_links_the_assignments_on_colab_and_for_download():
    html = built()
    page = html / "book" / "13_teaching.html"
    links = _links(page)
    for name in ASSIGNMENTS:
        target = f"notebooks/assignments/{name}.ipynb"
        assert publish.colab_link(CONFIG, target) in links, f"{name}: no Colab link on the teaching page"
        assert (html / target).is_file(), f"{name}: {target} was not published"
        nb = json.loads((html / target).read_text())
        assert nb["metadata"].get("otter"), f"{name}: the published copy is not the kit's student notebook"
        downloads = [u for u in links if u.endswith(f"/{name}.ipynb") and "_downloads" in u]
        assert downloads and all((page.parent / u).resolve().is_file() for u in downloads), f"{name}: download {downloads}"


# ----------------------------------------------------------------------------------------- student build
def test_student_build_hides_solutions_and_make_book_keeps_them(tmp_path):
    recipe = subprocess.run(["make", "-n", "--always-make", "book-student"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    assert "publish.py --student-config _build/student" in recipe, recipe
    assert "--config _build/student/_config.yml --toc _build/student/_toc.yml" in recipe, recipe
    assert "publish.py --student" in recipe, recipe
    assert "hide_solutions" not in (ROOT / "_config.yml").read_text(), "make book must keep the solutions"
    book = subprocess.run(["make", "-n", "--always-make", "book"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "hide_solutions" not in book and "publish.py" in book, book
    cfg_path, toc_path = publish.student_build_files(tmp_path)
    cfg = yaml.safe_load(cfg_path.read_text())
    extra = cfg["sphinx"]["config"]
    assert extra["hide_solutions"] is True and extra["html_copy_source"] is False and extra["external_toc_exclude_missing"]
    assert cfg["launch_buttons"]["notebooks_branch"] == "gh-pages-student" and cfg["html"]["use_download_button"] is False


def test_student_edition_has_no_instructor_page(tmp_path):
    """Issue 35: the student edition's table of contents holds no instructor page (the guide, the
    grading policy, the syllabus and week pages, the project brief), and excluded pages are not built."""
    _, toc_path = publish.student_build_files(tmp_path)
    docs = publish.student_docs(toc_path)
    assert "book/intro" in (toc_path.read_text()) and "book/02_newsvendor" in docs
    instructor = [d for d in docs if d == "book/13_teaching" or d.startswith("book/teaching/")]
    assert instructor == [], instructor
    full = publish.student_docs(ROOT / "_toc.yml")
    assert "book/13_teaching" in full, "the full edition keeps the guide"
    assert set(docs) == set(full) - {d for d in full if d == "book/13_teaching" or d.startswith("book/teaching/")}


@pytest.fixture(scope="module")
def published_student(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """The student edition's publishing step on the real sources, with the config and toc of ``make book-student``."""
    html = tmp_path_factory.mktemp("student-html")
    kit = tmp_path_factory.mktemp("student-kit")
    cfg_path, toc_path = publish.student_build_files(tmp_path_factory.mktemp("cfg"))
    return html, publish.publish(html, kit, student=True, cfg_path=cfg_path, toc=toc_path)


def test_student_notebooks_have_no_solution_and_the_wheel_only_kvdro(published_student):
    """D7: the student edition's notebooks/ are built from the chapters with every solution cut; each
    installs the published wheel (no clone of the repository that holds the masters); the wheel holds
    the kvdro package and the data it reads, nothing else; Binder builds the student branch."""
    import zipfile

    html, written = published_student
    notebooks = [p for p in written.values() if p.suffix == ".ipynb"]
    assert len(notebooks) >= 8
    assert not any("13_teaching" in str(p) or "/teaching/" in str(p) for p in notebooks), "an instructor page"
    leaks = [p.name for p in notebooks if re.search(r"\{solution\}|solution-start", p.read_text())]
    assert leaks == [], f"solutions in the student notebooks: {leaks}"
    url = _build_module().wheel_url(REPO_URL)
    for p in notebooks:
        text = p.read_text()
        assert '"clone"' not in text and "git clone" not in text, f"{p.name} clones the repository"
        nb = nbformat.read(p, as_version=4)
        assert url in nb.cells[0].source and publish.INSTALL_GUARD in nb.cells[0].source, p.name
    wheel = written[f"wheels/{_build_module().wheel_name()}"]
    with zipfile.ZipFile(wheel) as zf:
        tops = {n.split("/")[0] for n in zf.namelist()}
        assert tops == {"kvdro", "data", f"kvdro-{_version()}.dist-info"}, tops
        assert "kvdro/__init__.py" in zf.namelist() and "data/paper_base_models.json" in zf.namelist()
        assert not [n for n in zf.namelist() if "assignments" in n or n.startswith("book/")]
    assert url in (html / "requirements.txt").read_text() and (html / "runtime.txt").read_text() == "python-3.11\n"


def _master_secrets() -> set[str]:
    """Distinctive lines of the masters' solutions (not also in a chapter or in kvdro) and the names of their
    hidden tests."""
    secrets: set[str] = set()
    for name in ASSIGNMENTS:
        text = (ROOT / "book" / "assignments" / f"{name}.md").read_text()
        for block in re.findall(r"# BEGIN SOLUTION NO PROMPT\n(.*?)# END SOLUTION", text, re.S):
            secrets |= {line.strip() for line in block.splitlines() if len(line.strip()) > 30}
        for cell in re.findall(r"hidden: true\n.*?# END TEST CONFIG\n(def \w+)", text, re.S):
            secrets.add(cell)
    public = "\n".join(p.read_text() for p in [*(ROOT / "book").glob("*.md"), *(ROOT / "kvdro").rglob("*.py")])
    return {x for x in secrets if x not in public}  # distinctive: not a line the chapters or the package also have


def test_student_edition_leaks_no_master(published_student):
    """Issue 35: a scan of everything the student edition's publishing step writes (notebooks, the wheel's
    files, Binder's requirements) for the masters' solution lines and hidden test names finds nothing;
    the same scan of the masters (positive control) finds them all."""
    import zipfile

    html, written = published_student
    secrets = _master_secrets()
    assert len(secrets) >= 40, len(secrets)
    texts = []
    for path in written.values():
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as zf:
                texts += [zf.read(n).decode("utf-8", "replace") for n in zf.namelist()]
        else:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    blob = "\n".join(texts)
    assert [x for x in secrets if x in blob] == []
    masters = "\n".join((ROOT / "book" / "assignments" / f"{n}.md").read_text() for n in ASSIGNMENTS)
    assert all(x in masters for x in secrets), "positive control: the scan finds every secret in the masters"


def test_student_rewrite_points_colab_and_binder_at_the_student_branch(tmp_path):
    """The theme's Binder button builds the repository's main branch (the masters); the student edition's
    opens the published notebook on the student branch, as its Colab button does."""
    cfg_path, toc_path = publish.student_build_files(tmp_path / "cfg")
    cfg = yaml.safe_load(cfg_path.read_text())
    _, org, repo = publish.repository(cfg)
    branch = cfg["repository"]["branch"]
    colab = f"https://colab.research.google.com/github/{org}/{repo}/blob/{branch}/book/02_newsvendor.md"
    binder = f"https://mybinder.org/v2/gh/{org}/{repo}/{branch}?urlpath=lab/tree/book/02_newsvendor.md"
    page = tmp_path / "html" / "book" / "02_newsvendor.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="{colab}">Colab</a><a href="{binder}">Binder</a>')
    assert publish.rewrite_launch_links(tmp_path / "html", cfg_path=cfg_path, toc=toc_path, student=True) == 2
    text = page.read_text()
    assert f"/v2/gh/{org}/{repo}/gh-pages-student?urlpath=lab/tree/notebooks/book/02_newsvendor.ipynb" in text, text
    assert "/blob/gh-pages-student/notebooks/book/02_newsvendor.ipynb" in text and f"/{branch}" not in text, text


def test_strip_solutions_cuts_fenced_and_gated_solutions():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("keep\n::::{solution} ex-1\n:class: dropdown\nsecret answer\n::::\nkeep too"),
        nbformat.v4.new_markdown_cell("before\n```{solution-start} ex-2\n```\nsecret text"),
        nbformat.v4.new_code_cell("secret_code()"),
        nbformat.v4.new_markdown_cell("```{solution-end}\n```\nafter"),
        nbformat.v4.new_code_cell("kept_code()"),
    ])
    out = publish.strip_solutions(nb)
    text = "\n".join(c.source for c in out.cells)
    assert "secret" not in text and "solution" not in text, text
    assert [c.source for c in out.cells] == ["keep\nkeep too", "before\n", "after", "kept_code()"]


def _build_module():
    spec = importlib.util.spec_from_file_location("kvdro_course_build_l", ROOT / "book" / "assignments" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_assignment_install_cell_points_at_the_published_wheel():
    """The wheel URL in the masters' install cell is where the student edition publishes it."""
    build = _build_module()
    url = build.wheel_url(REPO_URL)
    assert url.endswith(f"/gh-pages-student/wheels/{build.wheel_name()}") and "raw.githubusercontent.com" in url
    assert build.STUDENT_BRANCH == "gh-pages-student"
    for name in ASSIGNMENTS:
        assert f'"{url}"' in (ROOT / "book" / "assignments" / f"{name}.md").read_text(), name


def test_built_student_site_has_no_solution_anywhere():
    """D7: ``grep -rl "{solution}\\|solution-start" _build/student/`` finds nothing: no page, no _sources
    download, no notebook; the Colab links open the student edition's own notebooks."""
    root = ROOT / "_build" / "student"
    if not (root / "html" / "index.html").exists():
        pytest.skip("no student build: run `make book-student`")
    run = subprocess.run(["grep", "-rl", r"{solution}\|solution-start", str(root)], capture_output=True, text=True)
    assert run.stdout == "", f"solutions in the student site:\n{run.stdout}"
    assert not (root / "html" / "_sources").exists(), "the student site serves its sources"
    assert (root / "html" / "wheels" / _build_module().wheel_name()).is_file()
    page = (root / "html" / "book" / "02_newsvendor.html").read_text(encoding="utf-8")
    links = re.findall(r'https://colab\.research\.google\.com/[^"]+', page)
    assert links and all("/blob/gh-pages-student/notebooks/" in u for u in links), links
    binder = re.findall(r'https://mybinder\.org/[^"]+', page)
    assert all("/gh-pages-student?urlpath=lab/tree/notebooks/" in u for u in binder), binder
    assert not (root / "html" / "book" / "13_teaching.html").exists() and not (root / "html" / "book" / "teaching").exists()
    clones = subprocess.run(["grep", "-rlF", 'git", "clone"', str(root / "html")], capture_output=True, text=True)
    assert clones.stdout == "", f"a cell that clones the repository:\n{clones.stdout}"


def test_built_student_book_has_no_solution():
    html = ROOT / "_build" / "student" / "html"
    if not (html / "index.html").exists():
        pytest.skip("no student build: run `make book-student`")
    with_solutions = [p.relative_to(html) for p in html.rglob("*.html") if 'class="solution' in p.read_text(encoding="utf-8")]
    assert not with_solutions, f"solutions in the student book: {with_solutions}"
