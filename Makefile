# kvdro: the two commands of the README, plus a few helpers. Every target sets itself up.
#   make book   -- create .venv if missing, install, execute every chapter, build _build/html (strict)
#   make test   -- same set-up, build the book (and its student edition and PDF), then unit/property/browser
#                  tests and every chapter under nbval
#   make lab    -- JupyterLab in which the book/*.md chapters open as notebooks (jupytext)
#   make assignments -- the course kit: student notebooks + otter autograders in _build/assignments
#   make book-student -- the book without exercise solutions (sphinx-exercise hide_solutions), in _build/student/html
#   make pdf    -- the whole book as one PDF (_build/pdf/kvdro.pdf): every built page printed by headless Chromium

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Real traces: a local folder that already holds them (never copied into the repository).
KVDRO_DATA_DIR ?= $(abspath $(wildcard ../shared/data))
export KVDRO_DATA_DIR
export PYTHONHASHSEED := 0
export MPLBACKEND := Agg
export KVDRO_REQUIRE_BOOK := 1

CHAPTERS := $(shell $(PYTHON) -c "import re,sys; print(' '.join(m + '.md' for m in re.findall(r'(?:root|file):\s*(\S+)', open('_toc.yml').read())))")

.PHONY: book book-student pdf test test-unit test-kit test-nbval test-browser test-site lab bench clean install notebooks assignments \
        conformance-install

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv installs the same pins as pip (constraints.txt) in ~6 s instead of ~60 s; pip if uv cannot be had
	$(BIN)/python -m pip install --quiet -c constraints.txt uv && $(BIN)/uv pip install --python $(BIN)/python --quiet \
	  -c constraints.txt -e ".[book,dev,sharegpt]" || $(BIN)/python -m pip install --quiet -c constraints.txt -e ".[book,dev,sharegpt]"
	touch $(STAMP)

# numba's on-disk cache of the compiled engines (vllm-v0 and the presets), once per install (~60 CPU s); the kit builds beside it
WARM := $(VENV)/.numba-warm
$(WARM): $(STAMP) kvdro/sim/_engine_kernels.py $(wildcard kvdro/sim/presets_compiled/*.py)
	$(BIN)/python -c "from kvdro.sim.engine_compiled import warm_up; warm_up()"
	touch $(WARM)

install: $(WARM)

# The course kit (chapter 13): for each book/assignments/<name>.md, _build/assignments/<name>/student/ and
# autograder/ as `otter assign` lays them out. The book links the student notebooks, so `book` needs it.
ASSIGNMENT_SOURCES := $(wildcard book/assignments/*.md) book/assignments/build.py $(wildcard book/assignments/kit_*.py) $(shell find kvdro -name '*.py')
_build/assignments/index.json: $(STAMP) $(ASSIGNMENT_SOURCES)
	$(BIN)/python book/assignments/build.py --out _build/assignments

assignments: _build/assignments/index.json

# After the build: .ipynb copies of the chapters and student notebooks in _build/html/notebooks, and
# the Colab launch links pointed at them (book/assignments/publish.py).
# (In `make test`, BOOK_AFTER=test-nbval: the book is built after nbval has filled its execution cache.)
book: $(WARM) _build/assignments/index.json | $(BOOK_AFTER)
	$(BIN)/jupyter-book build -n -W --keep-going .
	$(BIN)/python book/assignments/publish.py --html _build/html --kit _build/assignments
	@du -sh _build/html

# For students: the same book without the instructor pages (the Teaching part of _toc.yml) and with every
# exercise solution removed (sphinx-exercise's hide_solutions; no _sources or download button;
# notebooks/ without solutions that install the kvdro wheel, Colab and Binder on gh-pages-student; the
# wheel), built after `make book`, whose execution cache it reads (two builds executing into one cache at
# once race on its folders). `make book` keeps the solutions. publish.py writes its config and toc.
STUDENT_CONFIG := _build/student/_config.yml
STUDENT_TOC := _build/student/_toc.yml
book-student: book
	$(BIN)/python book/assignments/publish.py --student-config _build/student
	$(BIN)/jupyter-book build -n -W --keep-going --config $(STUDENT_CONFIG) --toc $(STUDENT_TOC) --path-output _build/student .
	mv _build/student/_build/html _build/student/html.new && rm -rf _build/student/html _build/student/_build && mv _build/student/html.new _build/student/html
	$(BIN)/python book/assignments/publish.py --student --config $(STUDENT_CONFIG) --toc $(STUDENT_TOC) --html _build/student/html --kit _build/assignments
	! grep -rl '{solution}\|solution-start' _build/student/
	! grep -rlF -e 'git", "clone"' -e '/v2/gh/kvdro/kvdro/main' -e 'colab.research.google.com/github/kvdro/kvdro/blob/main' _build/student/html
	test ! -e _build/student/html/book/13_teaching.html && test ! -e _build/student/html/book/teaching
	@du -sh _build/student/html

# The whole book as one PDF: every page of the built book (make book) printed by headless Chromium with
# the local MathJax and Vega, in _toc.yml order, joined by pdfunite. Needs Chromium and poppler-utils
# (apt-get install chromium poppler-utils; .ci/run installs both). (Jupyter Book's singlehtml builder
# cannot render MyST-NB's hidden-code cells, so the book is printed page by page.)
pdf: book
	$(BIN)/python book/assignments/print_pdf.py --html _build/html --out _build/pdf/kvdro.pdf

notebooks: $(STAMP)
	rm -rf _build/nbval && mkdir -p _build/nbval
	$(BIN)/python -c "import pathlib, sys, jupytext; [jupytext.write(jupytext.read(f), f'_build/nbval/{pathlib.Path(f).stem}.ipynb') \
	  for f in sys.argv[1:] if '{code-cell}' in pathlib.Path(f).read_text()]" $(CHAPTERS)  # one process for all: jupytext --to ipynb

# `make test` executes every chapter once: nbval runs them first (two workers, --dist loadfile: a
# notebook stays whole on one worker, its cells in order) and, through tests/nbval_record.py, stores the
# outputs of every chapter that passed in the book's jupyter-cache, so the book build that follows renders
# them instead of executing the chapters again (a chapter whose code differs, or that failed, it executes).
# Beside that, from the start: the course kit (built once: the book links it, the kit tests grade it),
# the unit and property tests on two pytest-xdist workers, then the course-kit tests; after the book,
# the browser test of its pages, its student edition and the PDF, then the tests of those. Four jobs at
# once on the 2 cores: the work is CPU-bound, so no core sits idle.
SITE_TESTS := tests/test_launch.py tests/test_pdf.py
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
NBVAL_EXECUTED := _build/nbval-executed

test: $(STAMP)
	$(MAKE) --no-print-directory -j4 BOOK_AFTER=test-nbval test-unit test-kit test-browser test-site

test-unit: $(WARM)
	$(PYTEST) -n 2 $(foreach t,tests/test_browser.py tests/test_assignments.py $(SITE_TESTS),--ignore=$(t)) tests

test-kit: $(STAMP) _build/assignments/index.json
	KVDRO_KIT_DIR=$(abspath _build/assignments) $(PYTEST) tests/test_assignments.py

test-nbval: notebooks $(WARM)
	rm -rf $(NBVAL_EXECUTED)
	KVDRO_NBVAL_EXECUTED=$(abspath $(NBVAL_EXECUTED)) PYTHONPATH=tests $(PYTEST) -n 2 --dist loadfile --nbval-lax -p nbval_record _build/nbval
	$(BIN)/python tests/nbval_record.py $(NBVAL_EXECUTED) _build/.jupyter_cache

test-browser: book
	$(PYTEST) tests/test_browser.py

test-site: book book-student pdf
	$(PYTEST) -n 2 --dist loadfile $(SITE_TESTS)

# Open .md chapters as notebooks by default (jupytext), not in the text editor.
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(STAMP)
	mkdir -p $(LAB_SETTINGS)
	echo '{"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}}}' > $(LAB_SETTINGS)/overrides.json
	$(BIN)/jupyter lab --ServerApp.contents_manager_class=jupytext.TextFileContentsManager $(LAB_ROOT) book/

bench: $(STAMP)
	$(BIN)/python -m kvdro.bench all

# vLLM's own v1 scheduler for `python -m kvdro.bench conformance` (issue 32), in its own venv .venv-vllm
# (never .venv): vLLM 0.11.0, torch 2.13.0 (CPU) and the packages the scheduler imports, all pinned and
# installed --no-deps (conformance-requirements.txt); ~2.5 GB. Not part of `make install` or `make test`.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: conformance-requirements.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -r conformance-requirements.txt
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python -c "import vllm.v1.core.sched.scheduler, vllm.model_executor.models.llama" > /dev/null
	touch $@

conformance-install: $(VLLM_VENV)/.installed

clean:
	rm -rf _build
