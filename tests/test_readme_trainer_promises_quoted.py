"""Every sentence of the docs about what a trainer receives is quoted by a test.

The sections and paragraphs below (of docs/trainers.md, docs/api.md and docs/curation.md,
where they moved from the README) promise what a trainer gets (consumption, formats,
leases and replay, serving rules, snapshots, manifests, rewards and logprobs, dataset
filters and grouping, claw_client's trainer utilities). Each of their sentences must be
quoted, word for word, in the docstring of a test (module, class or function) under tests/,
the test that checks it: a sentence added there without a test, or changed without its
test, fails here. Prose only: code blocks and tables are left to the tests that run them.
Quotes are compared without Markdown (backticks, bold, a link's target) and with whitespace
collapsed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINERS, API, CURATION = "docs/trainers.md", "docs/api.md", "docs/curation.md"

# Covered whole: (file, heading): the prose between the heading and the next heading (of any
# level).
SECTIONS = (
    (TRAINERS, "## Consumption: trainers pull batches"),
    (TRAINERS, "### What a trainer receives: rewards and logprobs"),
    (TRAINERS, "### Prefix-tree merge and trainer utilities"),
    (TRAINERS, "### verl: a DataProto"),
    (TRAINERS, "### Serving order and reuse"),
    (TRAINERS, "### Images for trainers"),
)
# Covered paragraphs of other sections: (file, heading, how the paragraph begins).
PARAGRAPHS = (
    (API, "### Branches", "The trajectory's reward applies to every branch"),
    (CURATION, "## Curation: what a trainer may get", "Filters:"),
)
# Paragraphs of the covered sections that are not about what the server delivers, and why.
LEFT_OUT = {
    "- **A tiny GRPO trainer**": (
        "describes examples/grpo_tiny.py, a trainer written against the API, not the data the "
        "server serves; tests/examples/test_grpo_tiny.py runs it"
    ),
    "- Install:": (
        "how to install verl without its CUDA requirements; the Makefile's .installed-test "
        "target runs these installs and tests/integrations/ imports what they install"
    ),
}

_HEADING = re.compile(r"^(#{1,6}) ")
# A sentence ends at . ! or ? followed by a space and a capital, a code span, bold or a quote.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*\"(])")
_ABBREVIATIONS = ("e.g.", "i.e.")
_LINK = re.compile(r"\[([^\]]*)\]\([^)\s]*\)")


def normalise(text: str) -> str:
    """Text without Markdown emphasis, code marks or link targets (a link reads as its text),
    whitespace collapsed."""
    return " ".join(_LINK.sub(r"\1", text).replace("`", "").replace("*", "").split())


def paragraphs(lines: list[str]) -> list[str]:
    """The prose paragraphs of a section's lines (a bullet is a paragraph), joined; fenced
    code blocks and tables left out."""
    out: list[str] = []
    current: list[str] = []
    fenced = False

    def close() -> None:
        if current:
            out.append(" ".join(current))
            current.clear()

    for line in lines:
        if line.startswith("```"):
            close()
            fenced = not fenced
            continue
        if fenced:
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("|"):
            close()
            continue
        if line.startswith("- "):
            close()
        current.append(stripped)
    close()
    return out


def section_lines(doc: str, heading: str) -> list[str]:
    """The lines of ``doc`` between ``heading`` and the next heading (a ``#`` line in a code
    block is no heading)."""
    lines = (ROOT / doc).read_text().splitlines()
    headings, fenced = [], False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and _HEADING.match(line):
            headings.append(i)
    at = [i for i in headings if lines[i] == heading]
    assert len(at) == 1, f"{doc} has {len(at)} headings {heading!r}"
    later = [i for i in headings if i > at[0]]
    return lines[at[0] + 1 : later[0] if later else len(lines)]


def sentences(paragraph: str) -> list[str]:
    text = paragraph.removeprefix("- ")
    for abbreviation in _ABBREVIATIONS:
        text = text.replace(f"{abbreviation} ", f"{abbreviation}\0")
    return [normalise(s.replace("\0", " ")) for s in _SENTENCE_END.split(text) if s.strip()]


def covered_sentences() -> list[tuple[str, str]]:
    """(where, sentence) for every sentence that must be quoted, in the docs' order."""
    out: list[tuple[str, str]] = []
    left_out_seen = set()
    for doc, heading in SECTIONS:
        found = paragraphs(section_lines(doc, heading))
        assert found, f"{doc} {heading!r} has no prose"
        for p in found:
            skip = [k for k in LEFT_OUT if p.startswith(k)]
            if skip:
                left_out_seen.update(skip)
                continue
            out += [(f"{doc} {heading}", s) for s in sentences(p)]
    for doc, heading, begins in PARAGRAPHS:
        found = [p for p in paragraphs(section_lines(doc, heading)) if p.startswith(begins)]
        assert len(found) == 1, f"{doc} {heading!r} has {len(found)} paragraphs beginning {begins!r}"
        out += [(f"{doc} {heading} / {begins}", s) for s in sentences(found[0])]
    assert left_out_seen == set(LEFT_OUT), f"LEFT_OUT names no paragraph: {set(LEFT_OUT) - left_out_seen}"
    return out


def docstrings_of_tests() -> list[str]:
    """Every docstring (module, class, function) of the test files, normalised."""
    out = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=True)
                if doc and path.name != Path(__file__).name:
                    out.append(normalise(doc))
    return out


def test_every_sentence_about_what_a_trainer_receives_is_quoted_by_a_test():
    # given: the covered sentences of the docs and every test docstring
    wanted = covered_sentences()
    docs = docstrings_of_tests()
    # then: each sentence is quoted word for word by some test
    missing = [f"{where}: {s}" for where, s in wanted if not any(s in d for d in docs)]
    assert not missing, "docs sentences no test quotes:\n" + "\n".join(missing)


def test_the_sentence_splitter_keeps_code_spans_and_abbreviations_whole():
    text = "- **Rule**: a `x.y` call, e.g. `f(1)`. `batch.steps` gives ids (see `a. b`). Done!"
    assert sentences(text) == ["Rule: a x.y call, e.g. f(1).", "batch.steps gives ids (see a. b).", "Done!"]


def test_a_link_reads_as_its_text():
    text = "- served its reward (see [What a trainer receives](trainers.md#what-a-trainer)). Next."
    assert sentences(text) == ["served its reward (see What a trainer receives).", "Next."]
