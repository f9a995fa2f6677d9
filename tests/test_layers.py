"""Imports point down: ``ros`` (the hub and its data planes) knows neither integration, and the vLLM side
never imports the verl side (an attached vLLM server runs without verl). Inside ``ros``, the folders are the
boundary: ``wire`` (what hub and client share) imports no other part, the client never imports the hub nor the
hub the client, the data planes import neither, and the plane factory imports only the planes' base. No module
imports itself back through others. Checked on the source text with ``ast``, so a forbidden import inside a
function counts as much as one at the top of a module."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterable

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tensorhub_verl"

ROS = "tensorhub_verl.ros"
DEV = "tensorhub_dev"
FORBIDDEN = {
    "vllm": ("tensorhub_verl.verl",),
    "ros": ("tensorhub_verl.vllm", "tensorhub_verl.verl"),
    "settings.py": ("tensorhub_verl.vllm", "tensorhub_verl.verl", "tensorhub_verl.ros"),
    "ros/wire": (f"{ROS}.client", f"{ROS}.hub", f"{ROS}.planes"),
    "ros/client": (f"{ROS}.hub",),
    "ros/hub": (f"{ROS}.client",),
    "ros/planes": (f"{ROS}.client", f"{ROS}.hub"),
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


def test_the_product_never_imports_the_developer_tools():
    """dev/ (``tensorhub_dev``: the lab, the simulator, the demo, research benchmarks, test helpers) imports the
    product, never the reverse; the CLI names dev's commands only as strings that it imports when dev is there."""
    roots = [PACKAGE, PACKAGE.parent / "hydra_plugins"]
    bad = {}
    for path in (p for root in roots for p in sorted(root.rglob("*.py"))):
        found = violations(path.read_text(), module_name(path), (DEV,), path.name == "__init__.py")
        if found:
            bad[str(path.relative_to(PACKAGE.parent))] = found
    assert bad == {}


def test_the_product_holds_no_developer_tool():
    tools = {"netlab", "sim", "demo", "testing"}
    assert not tools & {p.name for p in PACKAGE.iterdir()}, "developer tools belong in dev/tensorhub_dev"
    assert (PACKAGE.parent / "dev" / DEV / "__init__.py").is_file()


def test_the_vllm_layer_is_a_regular_package():
    assert (PACKAGE / "vllm" / "__init__.py").is_file()


def test_ros_has_the_four_parts_and_no_loose_modules():
    root = PACKAGE / "ros"
    assert sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()) == [
        "client", "hub", "planes", "wire"]
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py"], "a ros module belongs in one of the parts"


def test_the_plane_factory_imports_only_the_planes_base():
    """A plane's module (and NIXL's library) is imported by name when the plane is created, never by the factory
    or the settings a client's configuration imports."""
    planes = PACKAGE / "ros" / "planes"
    allowed = {"tensorhub_verl.errors", f"{ROS}.planes", f"{ROS}.planes.base", f"{ROS}.planes.host"}
    for name in ("factory.py", "config.py", "host.py"):
        path = planes / name
        found = _imports(ast.parse(path.read_text()), module_name(path), False, module_level=False)
        allowed_here = allowed | ({f"{ROS}.planes.factory"} if name == "config.py" else set())
        assert found <= allowed_here, f"planes/{name} imports {sorted(found - allowed_here)}"


def _package_modules(names: Iterable[str]) -> set[str]:
    """The modules of the package that ``names`` (imported names, ``pkg.module.attribute`` included) refer to."""
    modules = set(MODULES)
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def _imports(tree: ast.Module, importer: str, is_package: bool, module_level: bool) -> set[str]:
    """The package's modules ``importer`` imports: at module level only, or anywhere (functions too); never
    under ``if TYPE_CHECKING:``, which does not run."""
    nodes: list[ast.AST] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                nodes.append(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and module_level:
                continue
            else:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        visit([child])

    visit(tree.body)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            prefix = _absolute(node, importer, is_package)
            # ``from pkg import name``: the module pkg.name where there is one, else pkg itself
            names = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in MODULES else prefix
                     for alias in node.names]
        found.update(_package_modules(names))
    found.discard(importer)
    return found


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(module_level: bool, sources: dict[str, tuple[str, bool]] | None = None) -> dict[str, set[str]]:
    """module -> the package's modules it imports. ``sources``: module -> (source, is_package), the package's own
    by default."""
    sources = sources if sources is not None else MODULES
    return {name: _imports(ast.parse(source), name, is_package, module_level)
            for name, (source, is_package) in sources.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected set of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def _sources() -> dict[str, tuple[str, bool]]:
    return {module_name(path): (path.read_text(), path.name == "__init__.py")
            for path in sorted(PACKAGE.rglob("*.py"))}


MODULES = _sources()


def test_the_cycle_finder_sees_a_cycle_through_a_relative_import_and_skips_type_checking():
    sources = {"tensorhub_verl.a": ("from tensorhub_verl import b\n", False),
               "tensorhub_verl.b": ("from .c import x\n", False),
               "tensorhub_verl.c": ("def f():\n    import tensorhub_verl.a\n", False),
               "tensorhub_verl.d": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from tensorhub_verl import a\n", False)}
    global MODULES
    saved, MODULES = MODULES, sources
    try:
        assert cycles(import_graph(module_level=True, sources=sources)) == []
        assert cycles(import_graph(module_level=False, sources=sources)) == [
            ["tensorhub_verl.a", "tensorhub_verl.b", "tensorhub_verl.c"]]
    finally:
        MODULES = saved


def test_no_module_level_import_cycle_in_the_package():
    assert cycles(import_graph(module_level=True)) == []


def test_no_import_cycle_in_ros_even_through_imports_inside_functions():
    """A function-level import that closes a circle only hides it (``connect`` inside ``client.py``, importing
    the client forms that import ``client.py``, would be one); ``ros`` has none."""
    graph = {name: {dep for dep in deps if dep.startswith(ROS + ".")}
             for name, deps in import_graph(module_level=False).items() if name.startswith(ROS + ".")}
    assert cycles(graph) == []


def test_no_import_cycle_in_the_developer_tools():
    """dev/'s tools import one way too (the demo and the network lab once imported each other)."""
    root = PACKAGE.parent / "dev"
    sources = {".".join(p.relative_to(root).with_suffix("").parts[:-1] if p.name == "__init__.py"
                        else p.relative_to(root).with_suffix("").parts): (p.read_text(), p.name == "__init__.py")
               for p in sorted((root / DEV).rglob("*.py"))}
    global MODULES
    saved, MODULES = MODULES, {**MODULES, **sources}
    try:
        assert len(sources) > 40
        assert cycles(import_graph(module_level=False, sources=sources)) == []
    finally:
        MODULES = saved
