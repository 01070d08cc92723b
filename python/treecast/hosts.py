"""Host lists as ``treecast hosts`` reads them (``node[01-64]``, ``a,b``, exclusions):
so that a script can check a list before it starts a tree on it."""

from __future__ import annotations

import warnings
from typing import Iterable, Union

from . import _native

__all__ = ["expand", "fold", "count"]

Lists = Union[str, Iterable[str]]


def _list(include: Lists, exclude: Lists) -> list[str]:
    inc = [include] if isinstance(include, str) else list(include)
    exc = [exclude] if isinstance(exclude, str) else list(exclude)
    hosts, notes = _native.hosts_list(inc, exc)
    for note in notes:
        warnings.warn(f"treecast: {note}", stacklevel=3)
    return list(hosts)


def expand(include: Lists, exclude: Lists = ()) -> list[str]:
    """Every host of the lists, in order (``treecast hosts -e``)."""
    return _list(include, exclude)


def fold(include: Lists, exclude: Lists = ()) -> str:
    """The hosts folded into ranges (``treecast hosts``)."""
    return str(_native.hosts_fold(_list(include, exclude)))


def count(include: Lists, exclude: Lists = ()) -> int:
    """How many hosts (``treecast hosts -c``)."""
    return len(_list(include, exclude))
