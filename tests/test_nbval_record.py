"""tests/nbval_record.py: nbval's outputs go into the book's jupyter-cache, and only for chapters that pass.

A small MyST chapter and a failing one are made notebooks (as ``make notebooks`` does), run under nbval
with the plugin, and stored in a fresh jupyter-cache; the book's reader (MyST-NB) of the chapter's
Markdown then finds the cached notebook, with the outputs nbval's kernel produced.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
import nbval_record  # noqa: E402

HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# A chapter

"""
GOOD = HEADER + """```{code-cell} ipython3
print("hello from nbval")
```

Some text.

```{code-cell} ipython3
:tags: [hide-input]

6 * 7
```
"""
BAD = HEADER + """```{code-cell} ipython3
x = 1
```

```{code-cell} ipython3
raise ValueError("this chapter is broken")
```
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("nbval_record")
    notebooks, executed = root / "nbval", root / "executed"
    notebooks.mkdir()
    for name, text in (("good", GOOD), ("bad", BAD)):
        (root / f"{name}.md").write_text(text)
        jupytext.write(jupytext.read(root / f"{name}.md"), notebooks / f"{name}.ipynb")
    env = dict(os.environ, KVDRO_NBVAL_EXECUTED=str(executed), PYTHONPATH=str(TESTS))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "nbval_record",
                          "--nbval-lax", str(notebooks)], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    return root, executed, run


def test_only_a_notebook_whose_every_cell_passed_is_written(recorded):
    root, executed, run = recorded
    assert run.returncode == 1, run.stdout[-2000:]  # the broken chapter fails nbval
    assert "this chapter is broken" in run.stdout
    assert sorted(p.name for p in executed.glob("*.ipynb")) == ["good.ipynb"]


def test_the_written_notebook_holds_the_outputs_of_nbvals_kernel(recorded):
    _, executed, _ = recorded
    nb = nbformat.read(executed / "good.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == [1, 2]
    assert [(o.output_type, o.get("text")) for o in code[0].outputs] == [("stream", "hello from nbval\n")]
    [result] = code[1].outputs
    assert result.output_type == "execute_result" and result.data["text/plain"] == "42" and result.execution_count == 2


def test_the_book_reader_finds_the_stored_chapter_in_the_cache(recorded, tmp_path):
    from jupyter_cache import get_cache
    from myst_nb.core.read import read_myst_markdown_notebook
    from myst_parser.config.main import MdParserConfig

    root, executed, _ = recorded
    assert nbval_record.store(executed, tmp_path / "cache") == ["good"]
    cache = get_cache(str(tmp_path / "cache"))
    chapter = read_myst_markdown_notebook(GOOD, MdParserConfig(), path=str(root / "good.md"))
    record = cache.match_cache_notebook(chapter)  # KeyError if the book would not find it
    _, merged = cache.merge_match_into_notebook(chapter)
    outputs = [c.outputs for c in merged.cells if c.cell_type == "code"]
    assert record.pk and outputs[0][0]["text"] == "hello from nbval\n" and outputs[1][0]["data"]["text/plain"] == "42"
    with pytest.raises(KeyError):  # another chapter's code is not matched
        cache.match_cache_notebook(read_myst_markdown_notebook(BAD, MdParserConfig(), path=str(root / "bad.md")))
