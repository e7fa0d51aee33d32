"""The project's own documentation renders and its links resolve (a CommonMark parser with GFM tables).

What broke before: a table split in two by blank lines, cells cut by unescaped pipes, a closing fence with text
after it (the rest of the page became code), and an unclosed fence at the end.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "bench" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def parse(text: str):
    return MarkdownIt("commonmark").enable("table").parse(text)


def unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line.strip()))


def fence_problems(text: str) -> list[str]:
    lines = text.splitlines()
    problems = []
    for tok in parse(text):
        if tok.type != "fence":
            continue
        start, end = tok.map
        closing = lines[end - 1] if end - 1 > start else ""
        if not FENCE.match(closing) or closing.strip().strip("`~"):
            problems.append(f"line {start + 1}: the code block is not closed by a plain fence")
        for offset, line in enumerate(tok.content.splitlines()):
            if FENCE.match(line):
                problems.append(f"line {start + 2 + offset}: a fence line inside a code block (text after a fence?)")
    return problems


def table_problems(text: str) -> list[str]:
    lines = text.splitlines()
    tokens = parse(text)
    in_table: set[int] = set()
    problems = []
    for tok in tokens:
        if tok.type == "table_open":
            start, end = tok.map
            in_table.update(range(start, end))
            header = unescaped_pipes(lines[start])
            for i in range(start, end):
                if lines[i].strip() and unescaped_pipes(lines[i]) != header:
                    problems.append(f"line {i + 1}: {unescaped_pipes(lines[i])} cell borders, the header has {header}")
    code_lines = {i for tok in tokens if tok.type in ("fence", "code_block") for i in range(*tok.map)}
    for i, line in enumerate(lines):
        if line.startswith("|") and i not in in_table and i not in code_lines:
            problems.append(f"line {i + 1}: a table row outside any table (blank line inside a table?)")
    return problems


def slug(heading: str) -> str:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    tokens = parse(path.read_text(encoding="utf-8"))
    return {slug(tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"}


def links(path: Path) -> list[str]:
    out = []

    def walk(tokens):
        for t in tokens:
            if t.type == "link_open":
                out.append(t.attrGet("href"))
            if t.children:
                walk(t.children)

    walk(parse(path.read_text(encoding="utf-8")))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_renders(page):
    text = page.read_text(encoding="utf-8")
    assert fence_problems(text) + table_problems(text) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_resolve(page):
    broken = []
    for href in links(page):
        if re.match(r"^[a-z]+:", href):
            continue  # external
        target, _, anchor = href.partition("#")
        file = (page.parent / target).resolve() if target else page
        if not file.exists():
            broken.append(f"{href}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{href}: no such heading")
    assert broken == []


def test_the_checks_catch_what_broke_before():
    broken_fence = "```\ncode\n``` text after the fence\n\nprose\n"
    assert fence_problems(broken_fence)
    assert fence_problems("text\n\n```bash\nnever closed\n")
    split_table = "| a | b |\n| --- | --- |\n| 1 | 2 |\n\n| 3 | 4 |\n"
    assert table_problems(split_table)
    assert table_problems("| a | b |\n| --- | --- |\n| x `p|q` | 2 |\n")
    assert not fence_problems("```\nok\n```\n") and not table_problems("| a |\n| --- |\n| 1 |\n")


def test_nothing_points_outside_the_repository():
    """The design and contract the code cites live in docs/; a clone has no ../shared."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    offenders = []
    for name in tracked.splitlines():
        path = ROOT / name
        if path.suffix not in (".py", ".md", ".toml", ".yml", ".yaml", "") or path.name == "test_docs.py":
            continue
        if path.is_file() and "../shared" in path.read_text(encoding="utf-8", errors="ignore"):
            offenders.append(name)
    assert offenders == []


# The research notes the first sessions worked from; a clone has none of them, so nothing may cite them by name.
RESEARCH_NOTE = re.compile(
    r"(?<![\w/\[])(basal-contract|backends-determinism|systemone-api|cuda-path|peers-conventions|extensions)\.md"
)


def test_citations_name_the_projects_own_docs():
    """Docstrings cite `docs/extensions.md §5.9`, never the research note `extensions.md §5.9`."""
    assert RESEARCH_NOTE.search("see extensions.md §5") and RESEARCH_NOTE.search("(cuda-path.md §3.1)")
    assert not RESEARCH_NOTE.search("see docs/extensions.md §5")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    offenders = []
    for name in tracked.splitlines():
        path = ROOT / name
        if path.suffix not in (".py", ".md") or path.name == "test_docs.py" or not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8", errors="ignore").splitlines():
            if RESEARCH_NOTE.search(line.replace("](extensions.md)", "]()")):  # docs/README links its sibling
                offenders.append(f"{name}: {line.strip()[:80]}")
    assert offenders == []


# "the README's "On a Mac"", "the README's set-up section": a pointer to a README section by its name
README_SECTION = re.compile(r"README'?s? +(?:\"([^\"]+)\"|([\w -]+?) +section)", re.IGNORECASE)


def readme_section_problems(text: str, headings: list[str]) -> list[str]:
    """The README sections `text` names that no README heading has: a quoted name is a heading's whole text, an
    unquoted one ("its NVIDIA section") words of one."""
    lowered = [h.lower() for h in headings]
    out = []
    for m in README_SECTION.finditer(text.replace("\n", " ")):
        quoted, words = m.group(1), m.group(2)
        if quoted is not None and quoted.lower() not in lowered:
            out.append(f'"{quoted}"')
        elif words is not None and not any(words.lower().removeprefix("the ") in h for h in lowered):
            out.append(f"{words} section")
    return out


def test_pointers_to_readme_sections_name_real_ones():
    headings = [line.lstrip("#").strip() for line in (ROOT / "README.md").read_text().splitlines() if line[:2] == "##"]
    assert readme_section_problems('see the README\'s "On a Mac"', headings)  # negative controls
    assert readme_section_problems("see the README's set-up section", headings)
    real = "the README's \"Install and run\" and the README's one request section"
    assert not readme_section_problems(real, headings)
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    offenders = []
    for name in tracked.splitlines():
        path = ROOT / name
        if not (path.suffix in (".py", ".md", ".yml", ".yaml") or path.name in ("Makefile", "Dockerfile")):
            continue
        if path.name == "test_docs.py" or not path.is_file():
            continue
        offenders += [f"{name}: {p}" for p in readme_section_problems(path.read_text(errors="ignore"), headings)]
    assert offenders == []
