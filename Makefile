# kvdro: the two commands of the README, plus a few helpers. Every target sets itself up.
#   make book   -- create .venv if missing, install, execute every chapter, build _build/html (strict)
#   make test   -- same set-up, build the book, then unit/property/browser tests and every chapter under nbval
#   make lab    -- JupyterLab in which the book/*.md chapters open as notebooks (jupytext)
#   make assignments -- the course kit: student notebooks + otter autograders in _build/assignments

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

CHAPTERS := $(shell $(PYTHON) -c "import re,sys; print(' '.join(m + '.md' for m in re.findall(r'file:\s*(\S+)', open('_toc.yml').read())))")

.PHONY: book test lab bench clean install notebooks assignments

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[book,dev]"
	touch $(STAMP)

install: $(STAMP)

# The course kit (chapter 9): for each book/assignments/<name>.md, _build/assignments/<name>/student/ and
# autograder/ as `otter assign` lays them out. The book links the student notebooks, so `book` needs it.
ASSIGNMENT_SOURCES := $(wildcard book/assignments/*.md) book/assignments/build.py $(shell find kvdro -name '*.py')
_build/assignments/index.json: $(STAMP) $(ASSIGNMENT_SOURCES)
	$(BIN)/python book/assignments/build.py --out _build/assignments

assignments: _build/assignments/index.json

book: $(STAMP) _build/assignments/index.json
	$(BIN)/jupyter-book build -n -W --keep-going .
	@du -sh _build/html

notebooks: $(STAMP)
	rm -rf _build/nbval && mkdir -p _build/nbval
	for f in $(CHAPTERS); do \
	  if grep -q '{code-cell}' $$f; then \
	    $(BIN)/jupytext --quiet --to ipynb --output _build/nbval/$$(basename $${f%.md}).ipynb $$f; \
	  fi; \
	done

test: book notebooks
	$(BIN)/python -m pytest -q --nbval-lax tests _build/nbval

# Open .md chapters as notebooks by default (jupytext), not in the text editor.
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(STAMP)
	mkdir -p $(LAB_SETTINGS)
	echo '{"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}}}' > $(LAB_SETTINGS)/overrides.json
	$(BIN)/jupyter lab --ServerApp.contents_manager_class=jupytext.TextFileContentsManager $(LAB_ROOT) book/

bench: $(STAMP)
	$(BIN)/python -m kvdro.bench all

clean:
	rm -rf _build
