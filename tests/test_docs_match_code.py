"""The docs that describe the code name what exists: every verl patch module is listed in
``patches/verl/README.md``, and every module ``docs/architecture.md``'s picture names is in the package."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tensorhub_verl"
DEV = REPO / "dev" / "tensorhub_dev"


def test_the_patches_readme_lists_every_verl_patch():
    modules = {p.stem for p in (PACKAGE / "verl" / "patches").glob("verl_*.py")}
    listed = set(re.findall(r"`(verl_[0-9_]+[a-z_]+)`", (REPO / "patches" / "verl" / "README.md").read_text()))
    assert modules, "no patch modules found"
    assert modules - listed == set(), f"patches missing from patches/verl/README.md: {sorted(modules - listed)}"
    assert listed - modules == set(), f"the README lists patches that do not exist: {sorted(listed - modules)}"


def test_every_module_the_architecture_names_exists():
    # the picture and the names; the checklist after them names old modules on purpose
    text = (REPO / "docs" / "architecture.md").read_text().split("## Issue 23")[0]
    names = set(re.findall(r"\b([a-z_]+(?:/[a-z_]+)*\.py)\b", text))
    files = {p.relative_to(root).as_posix() for root in (PACKAGE, DEV) for p in root.rglob("*.py")}
    basenames = {Path(f).name for f in files}
    tests = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("*.py")}
    missing = sorted(n for n in names
                     if n not in basenames and not any(f.endswith("/" + n) or f == n for f in files | tests))
    assert len(names) > 30, sorted(names)
    assert missing == [], f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_line_the_checklist_cites_is_inside_its_file():
    # "where it stands" cites ``path.py:N`` (or ``:N-M``, ``:N,M``); the finding column quotes the old code
    text = (REPO / "docs" / "architecture.md").read_text().split("## Issue 23")[1].split("## Size")[0]
    stands = [row.rstrip(" |").rsplit(" | ", 1)[-1] for row in text.splitlines() if row.startswith("| ")]
    files = [p for root in (PACKAGE, DEV, REPO / "tests") for p in root.rglob("*.py")]
    cited = [(path, max(int(n) for n in re.findall(r"\d+", lines)))
             for stand in stands for path, lines in re.findall(r"([a-z0-9_/]+\.py):(\d+(?:[-,]\d+)*)", stand)]
    assert len(cited) > 20, cited
    wrong = []
    for path, line in cited:
        matches = [f for f in files if f.as_posix().endswith("/" + path)]
        if not any(len(f.read_text().splitlines()) >= line for f in matches):
            wrong.append(f"{path}:{line}" + ("" if matches else " (no such file)"))
    assert wrong == [], f"docs/architecture.md's checklist cites lines that do not exist: {wrong}"
