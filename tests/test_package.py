"""The public surface of ``fastfeed``: lazy, sorted, and no module shadows a function."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import fastfeed

REPO = Path(__file__).resolve().parent.parent


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert fastfeed.__all__ == sorted(fastfeed.__all__)
    for name in fastfeed.__all__:
        assert getattr(fastfeed, name) is not None, name
    assert dir(fastfeed) == fastfeed.__all__


def test_each_public_name_comes_from_the_module_the_table_names() -> None:
    for name, module in fastfeed._EXPORTS.items():
        assert getattr(importlib.import_module(module), name) is getattr(fastfeed, name), name


def test_no_public_function_shares_its_name_with_a_module() -> None:
    modules = {m.name.rpartition(".")[2] for m in pkgutil.walk_packages(fastfeed.__path__, "fastfeed.")}
    top = {m.name for m in pkgutil.iter_modules(fastfeed.__path__)}
    assert not (set(fastfeed.__all__) & top), set(fastfeed.__all__) & top
    # so the package needs no class swap, and patching a public function works as written
    assert "__class__" not in vars(fastfeed)
    with mock.patch("fastfeed.loader", lambda *a, **k: "patched"):
        assert fastfeed.loader("x") == "patched"
    assert modules  # the walk saw the sub-packages


def test_import_fastfeed_is_lazy() -> None:
    code = ("import sys, fastfeed; print(sorted(m for m in sys.modules if m.startswith('fastfeed')), "
            "'torch' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "['fastfeed'] False False", out.stdout
