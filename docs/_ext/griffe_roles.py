"""A griffe extension for the API reference: Sphinx roles in fastfeed's docstrings become links.

fastfeed's docstrings name other objects the Sphinx way (``:func:`loader```,
``:class:`~fastfeed.packed.index.DatasetIndex```, ``:meth:`save```, ``:mod:`fastfeed.loading.sources```,
``:attr:`title <target>```), which mkdocstrings would show as raw text. Each role becomes a
cross-reference for mkdocs-autorefs, with its text as code:

- the target is resolved the way Sphinx does for Python: a full path as it is, a public name of
  ``fastfeed`` (``fastfeed.StepMonitor``, lazy in ``fastfeed/__init__.py``) at its defining
  module, a relative one (``save``, ``Loader.load_state_dict``) in the object's class, then its
  module and the packages above it;
- ``~`` shows the last component only; ``:func:`` and ``:meth:`` add ``()`` as Sphinx does;
- a target found in fastfeed becomes ``<autoref identifier="PATH" optional>`TEXT`</autoref>``:
  a link where the API reference renders PATH, plain code where it does not (a private module),
  never a warning;
- a ``fastfeed`` target that griffe does not see is plain code, and a warning unless it exists at
  run time (``mkdocs build --strict`` fails: the docstring names something that is not there);
  other targets (``torch...``) are plain code.

The package is complete when griffe calls ``on_package``, so relative names resolve against all
of it; the docstrings fastfeed writes at import time (``griffe_options.py``) are in by then.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Iterator

import griffe

#: ``:role:`target```, ``:role:`~target```, ``:role:`text <target>```.
ROLE = re.compile(r":(?:py:)?(?P<role>mod|func|class|meth|data|attr|exc|obj|const):"
                  r"`(?P<tilde>~?)(?P<body>[^`]+?)`")
_TITLED = re.compile(r"(?P<text>.*?)\s*<(?P<target>[^<>]+)>")
_CALLABLE = ("func", "meth")


def _exports() -> dict[str, str]:
    """fastfeed's public names -> their defining modules (``fastfeed._EXPORTS``)."""
    try:
        return dict(importlib.import_module("fastfeed")._EXPORTS)
    except (ImportError, AttributeError):
        return {}


def _at_runtime(path: str) -> bool:
    """Whether ``path`` names something at run time that griffe does not see as an object (a
    name bound by tuple unpacking: ``GENERATION, EPOCH, ... = range(5)``)."""
    module, _, name = path.rpartition(".")
    while module:
        try:
            value: Any = importlib.import_module(module)
        except ImportError:
            module, _, head = module.rpartition(".")
            name = f"{head}.{name}"
            continue
        for part in name.split("."):
            if not hasattr(value, part):
                return False
            value = getattr(value, part)
        return True
    return False


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)  # type: ignore[arg-type]


#: The kinds of object each role names (``:func:`loader``` is the function, not the module
#: ``fastfeed.loading.cpu.loader`` beside it); a property is a function to griffe.
KINDS = {
    "mod": {griffe.Kind.MODULE},
    "func": {griffe.Kind.FUNCTION}, "meth": {griffe.Kind.FUNCTION},
    "class": {griffe.Kind.CLASS, griffe.Kind.TYPE_ALIAS}, "exc": {griffe.Kind.CLASS},
    "data": {griffe.Kind.ATTRIBUTE}, "const": {griffe.Kind.ATTRIBUTE},
    "attr": {griffe.Kind.ATTRIBUTE, griffe.Kind.FUNCTION},
}


def _find(pkg: griffe.Module, path: str) -> griffe.Object | None:
    """The object ``path`` names in ``pkg``, at its definition (an alias followed); None if none."""
    if path == pkg.path:
        return pkg
    if not path.startswith(pkg.path + "."):
        return None
    try:
        found = pkg[path[len(pkg.path) + 1:]]
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    if found.is_alias:
        try:
            return found.final_target  # type: ignore[no-any-return]
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
    return found  # type: ignore[no-any-return]


def resolve(role: str, target: str, obj: griffe.Object, pkg: griffe.Module, exports: dict[str, str]) -> str | None:
    """The path of the object a role names: the first candidate of the role's kind, else the first."""
    found = [o for c in _candidates(target, obj, pkg.path, exports) if (o := _find(pkg, c)) is not None]
    kinds = KINDS.get(role)
    best = next((o for o in found if kinds is None or o.kind in kinds), found[0] if found else None)
    return None if best is None else best.path


def _candidates(target: str, obj: griffe.Object, root: str, exports: dict[str, str]) -> Iterator[str]:
    """Where ``target`` may live, in Sphinx's order: as written, fastfeed's public names, then
    relative to the object, its class and module, and the packages above them."""
    head, _, rest = target.partition(".")
    if head == root:
        yield target
        name, _, tail = rest.partition(".")
        if name in exports:  # fastfeed.StepMonitor -> fastfeed.diagnosis.monitor.StepMonitor
            yield ".".join(filter(None, (exports[name], name, tail)))
        return
    scope: griffe.Object | None = obj
    while scope is not None:
        yield f"{scope.path}.{target}"
        scope = scope.parent
    if head in exports:
        yield f"{exports[head]}.{target}"
    yield f"{root}.{target}"


def rewrite(text: str, obj: griffe.Object, pkg: griffe.Module, exports: dict[str, str]) -> str:
    """``text`` with every Sphinx role replaced (see the module docstring)."""

    def one(m: re.Match[str]) -> str:
        body = m["body"].strip()
        titled = _TITLED.fullmatch(body)
        target = titled["target"].strip() if titled else body
        target = target.lstrip("~").removesuffix("()")
        shown = titled["text"] if titled else (target.rsplit(".", 1)[-1] if m["tilde"] else target)
        if m["role"] in _CALLABLE and not shown.endswith(")"):
            shown += "()"
        code = f"`{shown}`"
        found = resolve(m["role"], target, obj, pkg, exports)
        if found is not None:
            return f'<autoref identifier="{found}" optional>{code}</autoref>'
        if target.split(".", 1)[0] == pkg.path and not _at_runtime(target):
            griffe.logger.warning(f"{obj.path}: :{m['role']}:`{m['body']}` names nothing in {pkg.path}")
        return code

    return ROLE.sub(one, text)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring of the package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "fastfeed":
            return
        exports = _exports()
        for obj in _objects(pkg):
            if obj.docstring is not None and ":`" in obj.docstring.value:
                obj.docstring.value = rewrite(obj.docstring.value, obj, pkg, exports)
