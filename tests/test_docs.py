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


# Module paths the docs name: `basal/api/app.py`, `core/engine/pipeline.py` (relative to basal/ or a folder in it),
# `bench/lab/cpu_speed.py`, and dotted ones (`basal.core.engine.pipeline.Pipeline`, `basal.ray_serve.app:replicas`).
FILE_PATH = re.compile(r"(?<![\w./-])((?:[a-z_][\w-]*/)+[a-z_]\w*\.(?:py|sh|c|metal))\b")
BARE_FILE = re.compile(r"`([a-z_]\w*\.py)`")  # `render.py` in a list beside its folder's full path
FOLDER_PATH = re.compile(r"(?<![\w./-])(basal/(?:[a-z_]\w*/)+)(?![\w.])")
DOTTED = re.compile(r"(?<![\w./-])(basal(?:\.[A-Za-z_]\w*)+)(?::(\w+))?")
FILE_NAMES = ("json", "jsonl", "yml", "yaml", "md", "txt", "toml", "py")  # basal.json is a file, not a module


def defined_names(module: Path) -> set[str]:
    """Top-level names a module defines or imports (what `module.Name` or `module:name` may point at)."""
    import ast

    names = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def dotted_exists(root: Path, dotted: str, attr: str | None) -> bool:
    """`basal.a.b.Name`: the longest prefix that is a module or package, and the rest names defined in it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        base = root.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            rest = parts[cut:] + ([attr] if attr else [])
            return not rest or rest[0] in defined_names(module)
    return False


def file_exists(root: Path, path: str, tracked: list[str]) -> bool:
    if (root / path).exists() or (root / "basal" / path).exists():
        return True
    return any(name.endswith("/" + path) for name in tracked)  # relative to a folder the text is about


def missing_module_paths(root: Path, pages: list[Path]) -> list[str]:
    """Every module, script or package path a page names that does not exist, as "page:line: path"."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    tracked += [p.relative_to(root).as_posix() for p in (root / "basal").rglob("*.py")]  # moved, not yet committed
    quoted = {
        m for p in (root / "basal").rglob("*.py") for m in re.findall(r"[\"'](basal\.[\w.]+)[\"']", p.read_text())
    }
    out = []
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{page.relative_to(root)}:{number}"
            for path in FILE_PATH.findall(line):
                if not file_exists(root, path, tracked) and not path.startswith(("http", "tmp/", "path/", "your/")):
                    out.append(f"{where}: {path} does not exist")
            for name in BARE_FILE.findall(line):
                if not file_exists(root, name, tracked):
                    out.append(f"{where}: {name} does not exist")
            out += [f"{where}: {p} does not exist" for p in FOLDER_PATH.findall(line) if not (root / p).is_dir()]
            for dotted, attr in DOTTED.findall(line):
                if dotted.rpartition(".")[2] in FILE_NAMES or dotted in quoted:
                    continue  # a file name; a logger or span name the code spells out
                if not dotted_exists(root, dotted.rstrip("."), attr or None):
                    out.append(f"{where}: {dotted}{':' + attr if attr else ''} does not exist")
    return out


def test_every_module_path_the_docs_name_exists():
    assert missing_module_paths(ROOT, PAGES) == []


def test_a_wrong_module_path_is_named_with_its_page(tmp_path):
    """Negative control: a page naming a moved module, a stale package and a missing name fails, saying where."""
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(
        "See `basal/api/app.py` and `basal.core.engine.pipeline.Pipeline`.\n"
        "Old: `basal/deploy/ingress.py`, `basal.deploy.app:replicas`, `basal.core.engine.pipeline.NoSuchThing`,\n"
        "`core/engine/no_such_module.py` and `basal/no_such_folder/`.\n"
    )
    (tmp_path / "basal").symlink_to(ROOT / "basal")
    found = missing_module_paths(tmp_path, [page])
    assert found == [
        "docs/page.md:2: basal/deploy/ingress.py does not exist",
        "docs/page.md:2: basal.deploy.app:replicas does not exist",
        "docs/page.md:2: basal.core.engine.pipeline.NoSuchThing does not exist",
        "docs/page.md:3: core/engine/no_such_module.py does not exist",
        "docs/page.md:3: basal/no_such_folder/ does not exist",
    ], found


def unmapped(root: Path, map_text: str) -> list[str]:
    """What the package has that docs/architecture.md's map does not name: a top-level module or folder of basal/,
    a module of api/ or batch/ (the folders whose modules the map lists one by one)."""
    basal = root / "basal"
    names = [p.name for p in basal.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    names += [f"{p.name}/" for p in basal.iterdir() if (p / "__init__.py").is_file()]
    for folder in ("api", "batch"):
        names += [p.name for p in (basal / folder).rglob("*.py") if p.name != "__init__.py"]
    folder_line = re.compile(r"^  (\w+/)", re.M)  # a folder of basal/ opens its own line of the map
    folders = set(folder_line.findall(map_text))
    named = [
        n for n in names if (n in folders if n.endswith("/") else re.search(rf"(?<![\w/]){re.escape(n)}", map_text))
    ]
    return sorted(set(names) - set(named))


def architecture_map() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    return text.split("## Where the code lives", 1)[1].split("\n## ", 1)[0]


def test_the_architecture_map_names_every_folder_and_api_module():
    assert unmapped(ROOT, architecture_map()) == [], "add them to docs/architecture.md's map"


def test_a_module_missing_from_the_map_is_named(tmp_path):
    """Negative control: a map that lost a line is told which module it lost."""
    text = architecture_map()
    assert unmapped(ROOT, text.replace("multipart.py", "")) == ["multipart.py"]
    assert unmapped(ROOT, text.replace("  batch/ ", "  ")) == ["batch/"]
