"""A griffe extension for the API reference: an ``Attributes:`` entry without a type shows its
own member's type, or none.

griffe's Google parser (griffelib 2.4) takes the type of an untyped entry from the class member
of that name, and when there is none (``self.rank, self.world_size = ...`` makes no member it
sees) keeps the previous entry's type: ``Loader``'s ``rank`` showed ``DatasetIndex``. This parses
each class docstring that has such a section once, the way mkdocstrings will (griffe caches it),
and sets every untyped entry's type from its own member, or to none.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import griffe

_SECTION = re.compile(r"^\s*Attributes:\s*$", flags=re.M)
_TYPED = re.compile(r"^\s*(\w+)\s*\([^)]*\)\s*:", flags=re.M)


def _classes(obj: griffe.Object) -> Iterator[griffe.Class]:
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_class:
            yield member  # type: ignore[misc]
        if member.is_module or member.is_class:
            yield from _classes(member)  # type: ignore[arg-type]


def _own_type(cls: griffe.Class, name: str) -> Any:
    try:
        return cls[name].annotation
    except (KeyError, AttributeError, TypeError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


class AttributeTypes(griffe.Extension):
    """Give each untyped ``Attributes:`` entry its own member's type (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "fastfeed":
            return
        for cls in _classes(pkg):
            if cls.docstring is None or not _SECTION.search(cls.docstring.value):
                continue
            typed = set(_TYPED.findall(cls.docstring.value))  # "name (type): ..." keeps its type
            for section in cls.docstring.parsed:
                if section.kind is griffe.DocstringSectionKind.attributes:
                    for attr in section.value:
                        if attr.name not in typed:
                            attr.annotation = _own_type(cls, attr.name)
