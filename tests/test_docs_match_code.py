"""The docs that describe the code name what exists: every verl patch module is listed in
``patches/verl/README.md``, every module ``docs/architecture.md`` names is in the package, and
``docs/settings.md`` lists exactly the fields of the verl config."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tensorhub_verl"
DEV = REPO / "dev" / "tensorhub_dev"


def test_the_patches_readme_lists_every_verl_patch():
    """The product's patches in its first table, the CPU harness's (dev/) in the second, each in its own."""
    text = (REPO / "patches" / "verl" / "README.md").read_text()
    product_text, harness_text = text.split("## The CPU harness", 1)
    for where, folder, section in (("product", PACKAGE / "verl" / "patches", product_text),
                                   ("CPU harness", DEV / "verl_cpu" / "patches", harness_text)):
        modules = {p.stem for p in folder.glob("verl_*.py")}
        listed = set(re.findall(r"`(verl_[0-9_]+[a-z_]+)`", section))
        assert modules, f"no {where} patch modules found"
        assert modules - listed == set(), f"{where} patches missing from patches/verl/README.md: {sorted(modules - listed)}"
        assert listed - modules == set(), f"the README lists {where} patches that do not exist: {sorted(listed - modules)}"


def test_every_module_the_architecture_names_exists():
    text = (REPO / "docs" / "architecture.md").read_text()
    names = set(re.findall(r"\b([a-z_]+(?:/[a-z_]+)*\.py)\b", text))
    files = {p.relative_to(root).as_posix() for root in (PACKAGE, DEV) for p in root.rglob("*.py")}
    basenames = {Path(f).name for f in files}
    tests = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("*.py")}
    missing = sorted(n for n in names
                     if n not in basenames and not any(f.endswith("/" + n) or f == n for f in files | tests))
    assert len(names) > 30, sorted(names)
    assert missing == [], f"docs/architecture.md names modules that do not exist: {missing}"


def test_the_settings_page_lists_every_field_of_the_verl_config():
    import dataclasses

    from tensorhub_verl.verl.config import TensorHubVerlConfig

    fields = {f.name for f in dataclasses.fields(TensorHubVerlConfig)}
    rows = re.findall(r"^\| (.*?) \|", (REPO / "docs" / "settings.md").read_text(), re.M)
    listed = {name for cell in rows for name in re.findall(r"`([a-z_]+)`", cell)} - {"setting"}
    assert fields - listed == set(), f"docs/settings.md lacks: {sorted(fields - listed)}"
    assert listed - fields == set(), f"docs/settings.md lists fields that do not exist: {sorted(listed - fields)}"
    readme = re.findall(r"^\| `([a-z_]+)` \|", (REPO / "README.md").read_text(), re.M)
    assert readme and set(readme) <= fields, f"the README's settings table names unknown fields: {readme}"
