"""Imports point down: ``ros`` (the hub and its data planes) knows neither integration, and the vLLM side
never imports the verl side (an attached vLLM server runs without verl). Checked on the source text with
``ast``, so a forbidden import inside a function counts as much as one at the top of a module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tensorhub_verl"

FORBIDDEN = {
    "vllm": ("tensorhub_verl.verl",),
    "ros": ("tensorhub_verl.vllm", "tensorhub_verl.verl"),
    "settings.py": ("tensorhub_verl.vllm", "tensorhub_verl.verl", "tensorhub_verl.ros"),
}
"""Per subpackage (or module) of ``tensorhub_verl``: the packages it must not import."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, importer: str, is_package: bool = False) -> set[str]:
    """Every module ``importer`` names in an import statement, relative imports resolved to absolute names."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = importer.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            found.update(f"{prefix}.{alias.name}" for alias in node.names)
    return found


def violations(source: str, importer: str, forbidden: tuple[str, ...], is_package: bool = False) -> list[str]:
    return sorted(name for name in imported_modules(source, importer, is_package)
                  if any(name == banned or name.startswith(banned + ".") for banned in forbidden))


def test_the_checker_sees_absolute_relative_and_nested_imports():
    source = ("import tensorhub_verl.verl.config\n"
              "from ..verl import BACKEND_NAME\n"
              "def later():\n    from tensorhub_verl import verl\n"
              "from tensorhub_verl.ros import hub_client\n")
    found = violations(source, "tensorhub_verl.vllm.holder", ("tensorhub_verl.verl",))
    assert found == ["tensorhub_verl.verl", "tensorhub_verl.verl.BACKEND_NAME", "tensorhub_verl.verl.config"]
    assert violations("from tensorhub_verl.verl_extra import x\n", "tensorhub_verl.vllm.a",
                      ("tensorhub_verl.verl",)) == []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_point_down(layer):
    root = PACKAGE / layer
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    assert files, f"no modules under tensorhub_verl/{layer}"
    bad = {}
    for path in files:
        found = violations(path.read_text(), module_name(path), FORBIDDEN[layer], path.name == "__init__.py")
        if found:
            bad[str(path.relative_to(PACKAGE.parent))] = found
    assert bad == {}, f"imports that point up or sideways: {bad}"


def test_the_vllm_layer_is_a_regular_package():
    assert (PACKAGE / "vllm" / "__init__.py").is_file()
