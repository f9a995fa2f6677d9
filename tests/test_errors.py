"""One error hierarchy: every public exception class of the package derives from errors.TensorHubError, so a
caller can catch TensorHub's failures with one except clause. Checked on the source text with ``ast`` (importing
every module would pull in vLLM and verl)."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

from tensorhub_verl import errors

PACKAGE = Path(__file__).resolve().parents[1] / "tensorhub_verl"
_BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                       if isinstance(value, type) and issubclass(value, BaseException)}


def _base_names(node: ast.ClassDef) -> set[str]:
    return {base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "") for base in node.bases}


def test_every_public_exception_class_derives_from_tensorhub_error():
    classes = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (path.relative_to(PACKAGE.parent), _base_names(node))
    ours = {"TensorHubError"}
    changed = True
    while changed:  # the classes that derive from TensorHubError, through any depth of the package's classes
        changed = False
        for name, (_, bases) in classes.items():
            if name not in ours and bases & ours:
                ours.add(name)
                changed = True
    strays = sorted(f"{path}: {name}" for name, (path, bases) in classes.items()
                    if bases & _BUILTIN_EXCEPTIONS and name not in ours and not name.startswith("_"))
    assert not strays, f"exception classes outside the TensorHubError hierarchy: {strays}"
    assert issubclass(errors.PlaneMismatch, errors.InvalidRequest) and issubclass(errors.Cancelled,
                                                                                  errors.TensorHubError)
