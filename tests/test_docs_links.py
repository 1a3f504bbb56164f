"""Every relative link in README.md and docs/*.md resolves: the file (or folder) exists relative to
the page, and an anchor into a Markdown page names one of its headings (GitHub's slugs).

Links to http(s) and mailto are skipped; so is anything inside a code block or a code span, where
`[a](b)` is text, not a link."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
# [text](target) or [text](target "title"); an image ![alt](src) is a link to check too.
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
SKIP = ("http://", "https://", "mailto:")


def strip_fences(text: str) -> str:
    """The page with fenced code blocks blanked out (line numbers kept)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def strip_code(text: str) -> str:
    """The page with fenced blocks and code spans blanked out (line numbers kept)."""
    return CODE_SPAN.sub("", strip_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation removed,
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(strip_fences(page.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[tuple[int, str]]:
    text = strip_code(page.read_text())
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """`page:line: target (why)` for every relative link of the page that does not resolve."""
    broken = []
    for line, target in links(page):
        if target.startswith(SKIP):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{line}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where} (no heading with that anchor)")
    return broken


def test_pages_found():
    assert (ROOT / "README.md").exists()
    assert len(PAGES) > 1, "docs/*.md: no pages"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path):
    assert broken_links(page) == []


def test_readme_links_every_docs_page():
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for _, target in links(ROOT / "README.md")
        if not target.startswith(SKIP)
    }
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert missing == [], f"README does not link: {missing}"


def test_checker_catches_what_it_must(tmp_path: Path):
    """The checker itself: a missing file and a missing anchor are reported, code is not read."""
    (tmp_path / "other.md").write_text("# Other page\n\n## Run a `cluster` (local)\n\n## Twice\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n"
        "[ok](other.md) [ok](other.md#run-a-cluster-local) [ok](other.md#twice-1) [ok](#page)\n"
        "[web](https://example.com/x) [mail](mailto:a@b.c) [dir](.)\n"
        "[gone](missing.md) [bad](other.md#nowhere) [self](#nowhere)\n"
        "`[code](span.md)`\n```\n[code](block.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == [
        "page.md:4: missing.md (no such file)",
        "page.md:4: other.md#nowhere (no heading with that anchor)",
        "page.md:4: #nowhere (no heading with that anchor)",
    ]
