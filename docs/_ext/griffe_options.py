"""A griffe extension for the API reference: the docstrings fastfeed writes at import time.

The option groups (``fastfeed.Crop``, ...) and ``loader()`` / ``tune()`` / ``doctor()`` write
the lines of their options from the options' definitions (:mod:`fastfeed._options`), so the
source holds only a marker; read those docstrings from the imported objects instead."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe


def _runtime(path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


class RuntimeDocstrings(griffe.Extension):
    """Take the imported object's docstring where fastfeed generated it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if not obj.path.startswith("fastfeed.") or obj.kind not in (griffe.Kind.CLASS, griffe.Kind.FUNCTION):
            return
        value = _runtime(obj.path)
        generated = getattr(value, "__fastfeed_group__", False) is True or \
            getattr(value, "__fastfeed_doc__", False) is True
        if not generated or not value.__doc__:
            return
        text = inspect.cleandoc(value.__doc__)
        if obj.docstring is None:
            obj.docstring = griffe.Docstring(text, parent=obj)
        else:
            obj.docstring.value = text
