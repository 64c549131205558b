"""The README is a quickstart and the reference lives in docs/: the README stays short, and
every relative link of README.md and docs/*.md points to a file that exists and, when it
names one, to a heading of that file (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 160

# [text](target) outside code spans; images too. The target ends at whitespace or ")".
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6}) +(.*?) *#*$")


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: Markdown marks dropped, lower case, punctuation removed
    (word characters, spaces and hyphens kept), spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(path: Path) -> list[str]:
    """The lines of ``path`` outside fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def anchors(path: Path) -> set[str]:
    """Every heading anchor of ``path``; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path):
        match = _HEADING.match(line)
        if not match:
            continue
        base = github_anchor(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    """The targets of ``path``'s links that are not absolute URLs (code spans left out)."""
    targets = []
    for line in prose_lines(path):
        line = re.sub(r"`[^`]*`", "", line)
        targets += [t for t in _LINK.findall(line) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]
    return targets


def test_the_readme_is_a_short_quickstart():
    # given the README
    lines = (ROOT / "README.md").read_text().splitlines()
    # then it is at most MAX_README_LINES lines, starts with the project and has the quickstart
    assert len(lines) <= MAX_README_LINES, len(lines)
    assert lines[0] == "# Claw-R1"
    assert "## Quickstart" in lines
    # and it links every page of docs/
    linked = {t.split("#")[0] for t in relative_links(ROOT / "README.md")}
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= linked


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_points_to_an_existing_file_and_heading(page: Path):
    # given the page's relative links
    links = relative_links(page)
    broken = []
    for target in links:
        # when each is resolved against the page's folder
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        # then the file exists, and so does the heading it names
        if not dest.exists():
            broken.append(
                f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}"
            )
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.name}:\n" + "\n".join(broken)


def test_the_link_checker_finds_links_and_anchors():
    # given a heading with code, punctuation and a repeated one, and links in prose and code
    assert github_anchor("The processes: `Procfile`") == "the-processes-procfile"
    assert github_anchor("Claw-R1's trainer: the DataPool actor") == "claw-r1s-trainer-the-datapool-actor"
    assert github_anchor("Capacity (measured)") == "capacity-measured"
    # then the docs' links are found (a page without links would make the check above vacuous)
    assert any("#" in t for p in PAGES for t in relative_links(p))
    assert "docs/architecture.md#dependencies" in relative_links(ROOT / "README.md")


def test_a_page_that_sends_the_reader_to_a_doc_section_names_one_that_exists():
    # given: every page template that points at a section of a doc ("“Heading” in docs/x.md")
    cited = []
    for template in (ROOT / "templates").rglob("*.html"):
        for heading, doc in re.findall(r"“([^”]+)” in <code>(docs/[a-z_]+\.md)</code>", template.read_text()):
            cited.append((template.name, heading, doc))
    assert cited  # the consumption page does
    # then: the doc has that heading
    for name, heading, doc in cited:
        headings = {
            line.lstrip("#").strip() for line in (ROOT / doc).read_text().splitlines() if line.startswith("#")
        }
        assert heading in headings, (name, heading, doc)
