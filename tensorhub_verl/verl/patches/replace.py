"""Replace a verl function or method by a wrapper of it, once per process."""

from __future__ import annotations

from typing import Any, Callable, Sequence

MARK = "_tensorhub_patch"
"""Set on every replacement: a second application (a second import of the backend) changes nothing."""


def replace_once(owners: Any | Sequence[Any], name: str, make_replacement: Callable[[Any], Any], *,
                 mark: str = MARK) -> bool:
    """Sets ``owner.<name> = make_replacement(original)`` on each owner; False if it was already replaced.

    Several owners share one replacement (e.g. a class and the copy of it that ``ray.remote`` ships to actors).
    Another set of patches that wraps the same function (the developer tools' CPU harness) passes its own
    ``mark``, so that each set's wrapper is applied once whichever set comes first.
    """
    owners = list(owners) if isinstance(owners, (list, tuple)) else [owners]
    original = getattr(owners[0], name)
    if getattr(original, mark, False):
        return False
    replacement = make_replacement(original)
    setattr(replacement, mark, True)
    for owner in owners:
        setattr(owner, name, replacement)
    return True


def is_replaced(owner: Any, name: str, mark: str = MARK) -> bool:
    return bool(getattr(getattr(owner, name, None), mark, False))


__all__ = ["MARK", "is_replaced", "replace_once"]
