"""The arguments several commands share (fastfeed.cli.args): the loader flags, auto-or-int, sizes."""

from __future__ import annotations

import argparse

import pytest

from fastfeed.cli import build_parser
from fastfeed.cli.args import LOADER_FLAGS, add_loader_flags, auto_int, loader_args
from fastfeed.cli.diagnosis import LOADER_SETTINGS as DOCTOR_SETTINGS
from fastfeed.cli.tuning import LOADER_SETTINGS as TUNE_SETTINGS
from fastfeed.errors import ConfigError


def test_loader_flags_are_named_after_the_loader_keywords() -> None:
    for name, f in LOADER_FLAGS.items():
        assert f.flag == "--" + name.replace("_", "-") and f.doc
    assert set(TUNE_SETTINGS) <= set(LOADER_FLAGS) and set(DOCTOR_SETTINGS) <= set(LOADER_FLAGS)


def test_loader_args_defaults_and_conversions() -> None:
    p = argparse.ArgumentParser()
    names = tuple(LOADER_FLAGS)
    add_loader_flags(p, names)
    assert loader_args(p.parse_args([]), names) == {"decode": "cpu", "num_workers": "auto",
                                                   "prefetch_factor": "auto", "cache_dir": None}
    given = p.parse_args(["--decode", "none", "--num-workers", "3", "--prefetch-factor", "4", "--cache-dir", "/c"])
    assert loader_args(given, names) == {"decode": None, "num_workers": 3, "prefetch_factor": 4, "cache_dir": "/c"}
    with pytest.raises(ConfigError, match=r"^--prefetch-factor 'two': write a number or auto$"):
        loader_args(p.parse_args(["--prefetch-factor", "two"]), names)


def test_the_commands_take_their_loader_settings() -> None:
    parser = build_parser()
    doctor = parser.parse_args(["doctor", "d", "--num-workers", "2", "--decode", "dali", "--cache-dir", "c"])
    assert loader_args(doctor, DOCTOR_SETTINGS) == {"decode": "dali", "num_workers": 2, "prefetch_factor": "auto",
                                                    "cache_dir": "c"}
    assert loader_args(parser.parse_args(["tune", "d", "--decode", "none"]), TUNE_SETTINGS) == {"decode": None}


def test_auto_int() -> None:
    assert auto_int("auto", "--workers") == "auto" and auto_int("8", "--workers") == 8
    with pytest.raises(ConfigError, match=r"^--workers 'many': write a number or auto$"):
        auto_int("many", "--workers")
