"""A griffe extension for the API reference: fastfeed's docstrings head their doctests
``Example:`` (Google's style guide), which griffe's Google parser reads as an admonition of
Markdown text; rename the heading to ``Examples:`` so the ``>>>`` lines render as code."""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADING = re.compile(r"^(\s*)Example:\s*$", flags=re.M)


class ExampleSections(griffe.Extension):
    """Read every ``Example:`` section of a docstring as an ``Examples:`` section."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _HEADING.sub(r"\1Examples:", obj.docstring.value)
