"""Sphinx extension: a cross-reference to a chapter or a section reads "chapter 8" or "§8.3".

Without it, ``{doc}`08_answer``` and ``{ref}`sec-answer-bound``` render as the target's title, and a
sentence such as "Does reservation pay? asks whether reservation pays" uses a title as a noun. With it,
every such reference *without an explicit text* is written from the book's own numbering (the
numbered parts of ``_toc.yml``, which Sphinx numbers across parts): a chapter's page -> "chapter N"
("Chapter N" where it opens a sentence), a numbered section -> "§N.M". References with their own text
(``{doc}`the simulator <07_simulation>```), references in a table's cells (a list of titles), to exercises, theorems and figures, and targets
without a number (the back matter, the teaching guide's pages) are left as they are.

It runs as a post-transform just before Sphinx resolves references (priority 5 < 10), so the resolver
keeps the new text and still checks that every target exists (the build is strict).
"""

from __future__ import annotations

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import docname_join

SENTENCE_END = (".", "!", "?", ":")


def _section_numbers(env, docname: str, cache: dict) -> dict[str, tuple[int, ...]]:
    """Every id of every numbered section of ``docname`` -> its number (the page's title: key "")."""
    if docname not in cache:
        secnumbers = env.toc_secnumbers.get(docname, {})
        found: dict[str, tuple[int, ...]] = {}
        if secnumbers:
            doctree = env.get_doctree(docname)
            for section in doctree.findall(nodes.section):
                ids = section.get("ids", [])
                number = next((secnumbers["#" + i] for i in ids if "#" + i in secnumbers), None)
                if number is None and section.parent is doctree:  # the page's title: Sphinx keys it ""
                    number = secnumbers.get("")
                if number:
                    found.update({i: number for i in ids})
            if "" in secnumbers:
                found[""] = secnumbers[""]
        cache[docname] = found
    return cache[docname]


def _ancestors(node: nodes.Node):
    while node.parent is not None:
        node = node.parent
        yield node


def _opens_sentence(node: nodes.Node) -> bool:
    """True where the reference is the first thing of its paragraph or follows a sentence's end."""
    parent = node.parent
    index = parent.index(node) if parent is not None else 0
    if index == 0:
        return True
    before = parent[index - 1].astext().rstrip()
    return before == "" or before.endswith(SENTENCE_END)


def numbered_text(env, node: addnodes.pending_xref, cache: dict) -> str | None:
    """The text "chapter N" / "§N.M" for a chapter or section reference without its own text, else None."""
    if node.get("refexplicit") or node.get("refdomain") not in ("std", ""):
        return None
    if any(isinstance(a, nodes.entry) for a in _ancestors(node)):  # a table cell lists titles: keep them
        return None
    if node.get("reftype") == "doc":
        target, anchor = docname_join(node["refdoc"], node["reftarget"]), ""
    elif node.get("reftype") == "ref":
        entry = env.domaindata["std"]["labels"].get(node["reftarget"].lower())
        if not entry or not entry[2]:  # not a section (an exercise, a figure, a table): keep its text
            return None
        target, anchor = entry[0], entry[1]
    else:
        return None
    numbers = _section_numbers(env, target, cache)
    number = numbers.get(anchor) or (numbers.get("") if anchor == "" else None)
    if not number:
        return None
    if len(number) == 1 and (anchor == "" or number == numbers.get("")):
        word = "Chapter" if _opens_sentence(node) else "chapter"
        return f"{word} {number[0]}"
    return "§" + ".".join(str(n) for n in number)


class NumberedReferences(SphinxPostTransform):
    """Write chapter and section references from the book's numbering (module docstring)."""

    default_priority = 5

    def run(self, **kwargs) -> None:
        cache = self.env.temp_data.setdefault("kvdro_xref_numbers", {})
        for node in list(self.document.findall(addnodes.pending_xref)):
            text = numbered_text(self.env, node, cache)
            if text is None:
                continue
            inner = nodes.inline(text, text, classes=["xref", "std", f"std-{node['reftype']}"])
            node.replace(node.children[0], inner) if node.children else node.append(inner)
            for extra in node.children[1:]:
                node.remove(extra)
            node["refexplicit"] = True


def setup(app: Sphinx) -> dict:
    app.add_post_transform(NumberedReferences)
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}
