"""pack()'s options are defined once (fastfeed/packing/options.py): the signature, the docstring, the
checks and the ``fastfeed pack`` flags all agree with the definitions."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging

import pytest

from fastfeed._options import group, option
from fastfeed.cli import build_parser
from fastfeed.cli.args import add_option_flags, option_args
from fastfeed.cli.dataset import PACK_FLAGS
from fastfeed.errors import ConfigError
from fastfeed.host import cpu_count
from fastfeed.packing.api import pack
from fastfeed.packing.options import OPTIONS, PackOptions

#: pack()'s keywords that are not PackOptions: how it runs, not what it writes.
NOT_OPTIONS = {"src", "dst", "progress", "engine", "ray_address", "storage_options"}


def _pack_parser() -> argparse.ArgumentParser:
    return build_parser()._subparsers._group_actions[0].choices["pack"]  # type: ignore[union-attr]


def test_the_signature_defaults_are_the_definitions_defaults() -> None:
    params = inspect.signature(pack).parameters
    assert set(params) - NOT_OPTIONS == set(OPTIONS)
    assert [n for n in params if n in OPTIONS] == list(OPTIONS)  # the same order: the docstring's
    for f in dataclasses.fields(PackOptions):
        p = params[f.name]
        assert p.kind is p.KEYWORD_ONLY and p.default == f.default, f.name
    # a new option is a field: say why when this grows (19 and 20: max_pixels, the one pixel limit of every
    # format and store mode, and allow_outside, the one switch for files from outside SRC; issue 27)
    assert len(OPTIONS) <= 20


def test_every_option_is_in_the_docstring_from_its_definition() -> None:
    doc = " ".join(pack.__doc__.split())
    assert "{options}" not in doc and getattr(pack, "__fastfeed_doc__", False) is True
    args = doc[doc.index("Args:"):doc.index("Returns:")]
    for f in dataclasses.fields(PackOptions):
        spec = f.metadata["fastfeed"]
        assert spec.doc and f"{f.name}: {spec.doc.rstrip('.')}." in args, f.name
    assert "progress: callback" in args and "engine: ``local``" in args  # the hand-written ones stay


def test_every_flag_of_pack_comes_from_a_definition() -> None:
    p = _pack_parser()
    by_dest = {a.dest: a for a in p._actions}
    flags = {f.name: f.metadata["fastfeed"].flag for f in dataclasses.fields(PackOptions)}
    assert set(PACK_FLAGS) == set(OPTIONS)  # every option is a flag of `fastfeed pack`
    for name in PACK_FLAGS:
        spec = PackOptions.__dataclass_fields__[name].metadata["fastfeed"]
        assert flags[name] == "--" + name.replace("_", "-") and flags[name] in by_dest[name].option_strings
        assert spec.doc.split(";")[0] in " ".join((by_dest[name].help or "").split()), name
    assert "--no-shuffle" in by_dest["shuffle"].option_strings
    assert "--no-jpeg-restarts" in by_dest["jpeg_restarts"].option_strings
    assert "--no-overwrite" not in by_dest["overwrite"].option_strings  # --overwrite alone
    with pytest.raises(SystemExit):  # one of --shard-size / --samples-per-shard
        p.parse_args(["s", "d", "--shard-size", "1GB", "--samples-per-shard", "3"])


def test_the_flags_defaults_mean_packs_defaults_but_workers() -> None:
    args = _pack_parser().parse_args(["s", "d"])
    given = option_args(args, PackOptions, PACK_FLAGS)
    assert given["workers"] == "auto" and given["input"] == "auto"  # the CLI packs on every core
    assert PackOptions.create(**given) == PackOptions.create(**{**given, "workers": cpu_count(), "input": None}) \
        == dataclasses.replace(PackOptions(), workers=cpu_count())


def test_flags_are_read_by_their_definitions() -> None:
    args = _pack_parser().parse_args(["s", "d", "--samples-per-shard", "4", "--workers", "2", "--no-shuffle",
                                      "--seed", "7", "--max-side", "64", "--quality", "80", "--overwrite",
                                      "--no-jpeg-restarts", "--store", "raw", "--on-error", "skip"])
    got = option_args(args, PackOptions, PACK_FLAGS)
    assert {k: got[k] for k in ("samples_per_shard", "workers", "shuffle", "seed", "max_side", "quality",
                                "overwrite", "jpeg_restarts", "store", "on_error")} == {
        "samples_per_shard": 4, "workers": 2, "shuffle": False, "seed": 7, "max_side": 64, "quality": 80,
        "overwrite": True, "jpeg_restarts": False, "store": "raw", "on_error": "skip"}
    with pytest.raises(ConfigError, match=r"^--seed 'x': write a whole number$"):
        option_args(_pack_parser().parse_args(["s", "d", "--seed", "x"]), PackOptions, ("seed",))
    with pytest.raises(ConfigError, match=r"^--workers 'many': write a number or auto$"):
        option_args(_pack_parser().parse_args(["s", "d", "--workers", "many"]), PackOptions, ("workers",))


def test_the_generic_flag_builder_refuses_an_option_without_a_flag() -> None:
    @group
    class Plain:
        """No flag."""
        n: int = option(1, "a number")

    with pytest.raises(ValueError, match="no command-line flag"):
        add_option_flags(argparse.ArgumentParser(), Plain, ("n",))


def test_options_are_checked_and_normalised_when_built() -> None:
    o = PackOptions.create(shard_size="1GiB", workers="auto", columns={"image": "jpg", "caption": "txt"},
                           input="parquet", store="jpeg", jpeg_restarts=False, seed=3)
    assert (o.shard_size, o.workers, o.columns, o.jpeg_restarts) == (2**30, cpu_count(), "image=jpg,caption=txt",
                                                                     False)
    assert PackOptions(shard_size="1GiB", jpeg_restarts=False) == PackOptions.create(shard_size=2**30,
                                                                                     jpeg_restarts=False)
    assert dataclasses.replace(o, seed=4).seed == 4
    with pytest.raises(ConfigError, match=r"^seed='4': must be an integer from 0 to 18446744073709551615$"):
        dataclasses.replace(o, seed="4")  # a copy is checked too
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.seed = 5  # type: ignore[misc]
    assert PackOptions.create(store="raw").jpeg_restarts is False  # raw stores no JPEG: no markers unless asked
    np = pytest.importorskip("numpy")
    assert PackOptions.create(seed=np.int64(2), samples_per_shard=np.int32(5), jpeg_restarts=False).seed == 2


@pytest.mark.parametrize("kw,msg", [
    ({"samples_per_shard": 0}, r"^samples_per_shard=0: must be an integer >= 1$"),
    ({"max_side": 4}, r"^max_side=4: must be an integer >= 8 \(pixels of the longer side\)$"),
    ({"quality": 0}, r"^quality=0: must be an integer from 1 to 100"),
    ({"workers": 1.5}, r"^workers=1.5: must be an integer >= 1 or 'auto'$"),
    ({"format": "zip"}, r"^format='zip': choose one of lmdb, tar$"),
    ({"key": ""}, r"^key='': name the column"),
    ({"tokenize": "txt"}, r"needs a tokenizer: pass --tokenizer PATH"),
    ({"input": "files", "key": "id"}, r"--columns, --key\) are for parquet and HF datasets input, not input='files'"),
    ({"store": "raw", "tokenize": "txt", "tokenizer": "t.json"}, r"store='raw' is for image folders"),
])
def test_each_check_names_the_argument_and_the_fix(kw: dict, msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        PackOptions.create(**kw)


def test_a_tiny_int_shard_size_is_bytes_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "fastfeed.pack"):
        assert PackOptions.create(shard_size=2000, jpeg_restarts=False).shard_size == 2000
    assert any("shard_size=2000" in r.getMessage() and "very small" in r.getMessage() for r in caplog.records)
