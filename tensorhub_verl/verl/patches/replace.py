"""Replace a verl function or method by a wrapper of it, once per process."""

from __future__ import annotations

from typing import Any, Callable, Sequence

MARK = "_tensorhub_patch"
"""Set on every replacement: a second application (a second import of the backend) changes nothing."""


def replace_once(owners: Any | Sequence[Any], name: str, make_replacement: Callable[[Any], Any]) -> bool:
    """Sets ``owner.<name> = make_replacement(original)`` on each owner; False if it was already replaced.

    Several owners share one replacement (e.g. a class and the copy of it that ``ray.remote`` ships to actors).
    """
    owners = list(owners) if isinstance(owners, (list, tuple)) else [owners]
    original = getattr(owners[0], name)
    if getattr(original, MARK, False):
        return False
    replacement = make_replacement(original)
    setattr(replacement, MARK, True)
    for owner in owners:
        setattr(owner, name, replacement)
    return True


def is_replaced(owner: Any, name: str) -> bool:
    return bool(getattr(getattr(owner, name, None), MARK, False))


__all__ = ["MARK", "is_replaced", "replace_once"]
