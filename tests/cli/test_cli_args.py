"""The arguments several commands share (fastfeed.cli.args): the loader flags, auto-or-int, sizes."""

from __future__ import annotations

import argparse

import pytest

from fastfeed.cli import build_parser
from fastfeed.cli.args import add_loader_flags, auto_int, loader_args
from fastfeed.cli.diagnosis import LOADER_SETTINGS as DOCTOR_SETTINGS
from fastfeed.cli.tuning import LOADER_SETTINGS as TUNE_SETTINGS
from fastfeed.errors import ConfigError
from fastfeed.loading.options import find_option

FLAGGED = ("decode", "num_workers", "prefetch_factor", "cache_dir")


def test_loader_flags_are_named_after_the_loader_keywords_and_come_from_their_definition() -> None:
    for name in FLAGGED:
        _, f, spec = find_option(name)
        assert spec.flag == "--" + name.replace("_", "-") and spec.doc
    assert set(TUNE_SETTINGS) <= set(FLAGGED) and set(DOCTOR_SETTINGS) <= set(FLAGGED)
    text = build_parser()._subparsers._group_actions[0].choices["doctor"].format_help()  # type: ignore[union-attr]
    assert find_option("prefetch_factor")[2].doc.split(";")[0] in " ".join(text.split())


def test_loader_args_defaults_and_conversions() -> None:
    p = argparse.ArgumentParser()
    names = FLAGGED
    add_loader_flags(p, names)
    assert loader_args(p.parse_args([]), names) == {"decode": "cpu", "num_workers": "auto",
                                                   "workers": {"prefetch_factor": "auto"}, "cache_dir": None}
    given = p.parse_args(["--decode", "none", "--num-workers", "3", "--prefetch-factor", "4", "--cache-dir", "/c"])
    assert loader_args(given, names) == {"decode": None, "num_workers": 3, "workers": {"prefetch_factor": 4},
                                         "cache_dir": "/c"}
    with pytest.raises(ConfigError, match=r"^--prefetch-factor 'two': write a number or auto$"):
        loader_args(p.parse_args(["--prefetch-factor", "two"]), names)


def test_the_commands_take_their_loader_settings() -> None:
    parser = build_parser()
    doctor = parser.parse_args(["doctor", "d", "--num-workers", "2", "--decode", "dali", "--cache-dir", "c"])
    assert loader_args(doctor, DOCTOR_SETTINGS) == {"decode": "dali", "num_workers": 2,
                                                    "workers": {"prefetch_factor": "auto"}, "cache_dir": "c"}
    assert loader_args(parser.parse_args(["tune", "d", "--decode", "none"]), TUNE_SETTINGS) == {"decode": None}


def test_auto_int() -> None:
    assert auto_int("auto", "--workers") == "auto" and auto_int("8", "--workers") == 8
    with pytest.raises(ConfigError, match=r"^--workers 'many': write a number or auto$"):
        auto_int("many", "--workers")
