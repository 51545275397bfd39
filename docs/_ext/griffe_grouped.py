"""A griffe extension for the API reference: a docstring entry that documents several names at
once (``rank, world_size: this process's place in the job.``) becomes one entry per name.

griffe's Google parser reads ``rank, world_size`` as one parameter of that name, which the
signature does not have: the table shows it with no type and "required". Split, each name gets
its own row with its type and default from the signature, and the description they share.
Applies to the sections that list names: ``Args:`` (and its spellings) and ``Attributes:``.
Runs on every object when griffe creates it, after ``griffe_options.py`` has put in the
docstrings fastfeed writes at import time (list this extension after that one).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SECTION = re.compile(r"^(?P<indent>\s*)(?:Args|Arguments|Params|Parameters|Keyword Args|Keyword Arguments|"
                      r"Other Parameters|Attributes):\s*$")
_GROUPED = re.compile(r"^(?P<indent>\s+)(?P<names>\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)+)(?P<type>\s*\([^)]*\))?:"
                      r"(?P<rest>\s.*|)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def split_grouped(text: str) -> str:
    """``text`` with each grouped entry of a name-listing section written once per name.

    Example:
        >>> print(split_grouped("Args:\\n    rank, world_size: the place\\n        in the job.\\n    seed: s."))
        Args:
            rank: the place
                in the job.
            world_size: the place
                in the job.
            seed: s.
    """
    lines = text.split("\n")
    out: list[str] = []
    section: int | None = None  # the indent of the section's heading, inside one
    entry: int | None = None  # the indent of its entries
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = _SECTION.match(line)
        if heading:
            section, entry = len(heading["indent"]), None
            out.append(line)
            i += 1
            continue
        if section is not None and line.strip():
            if _indent(line) <= section:
                section = entry = None
            elif entry is None:
                entry = _indent(line)
        grouped = _GROUPED.match(line) if entry is not None and _indent(line) == entry else None
        if not grouped:
            out.append(line)
            i += 1
            continue
        j = i + 1  # the entry's continuation lines: indented deeper (blank lines inside it too)
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > entry):
            j += 1
        while j > i + 1 and not lines[j - 1].strip():
            j -= 1
        body = lines[i + 1:j]
        for name in (n.strip() for n in grouped["names"].split(",")):
            out.append(f"{grouped['indent']}{name}{grouped['type'] or ''}:{grouped['rest']}")
            out.extend(body)
        i = j
    return "\n".join(out)


class GroupedParameters(griffe.Extension):
    """Split the grouped entries of every docstring (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and "," in obj.docstring.value:
            obj.docstring.value = split_grouped(obj.docstring.value)
