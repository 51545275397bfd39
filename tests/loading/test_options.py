"""loader()'s options: each defined once, validated once (fastfeed.loading.options), for both backends, before any data is read."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest

import fastfeed
from fastfeed.decode.geometry import normalize_image_size
from fastfeed.errors import ConfigError
from fastfeed.loading.groups import GROUPS, IMAGENET_MEAN
from fastfeed.loading.sources import as_sources
from fastfeed.loading.options import (
    DALI_MEETS,
    DALI_ONLY,
    DALI_REFUSES,
    FLAT,
    LEGACY,
    LoaderOptions,
    check_dali_knobs,
    find_option,
    loader_options,
    with_values,
)

NOWHERE = "/nonexistent/dataset"  # options fail before the path is looked at
ONE = dict(rank=0, world_size=1)
DALI = dict(decode="dali", image_size=16, **ONE)


def test_a_misspelled_keyword_names_the_close_option() -> None:
    with pytest.raises(ConfigError, match=r"unexpected keyword argument 'imagesize'; did you mean image_size=\?"):
        fastfeed.loader(NOWHERE, batch_size=4, imagesize=224)
    with pytest.raises(ConfigError, match="'num_thread'.*did you mean num_threads="):
        fastfeed.loader(NOWHERE, batch_size=4, decode="dali", image_size=16, num_thread=2)
    with pytest.raises(ConfigError, match="Dali has no option 'num_thread'; did you mean num_threads"):
        fastfeed.loader(NOWHERE, batch_size=4, decode="dali", image_size=16, dali={"num_thread": 2})
    with pytest.raises(ConfigError, match=r"crop=3: pass a fastfeed.Crop\(...\)"):
        fastfeed.loader(NOWHERE, batch_size=4, crop=3)
    with pytest.raises(ConfigError, match="'zzz'; see help"):
        fastfeed.loader(NOWHERE, batch_size=4, zzz=1)


def test_dali_options_need_decode_dali() -> None:
    for decode in ("cpu", None):
        with pytest.raises(ConfigError, match=r"num_threads=4.*decode='dali'.*CPU threads"):
            fastfeed.loader(NOWHERE, batch_size=4, decode=decode, dali=fastfeed.Dali(num_threads=4))
    assert set(DALI_ONLY) == {f.name for f in dataclasses.fields(fastfeed.Dali)}
    loader_options(batch_size=4, decode="cpu", dali=fastfeed.Dali(), **ONE)  # an unchanged group asks for nothing


@pytest.mark.parametrize("name,value,hint", [
    ("num_workers", 8, "num_threads="), ("prefetch_factor", 4, "prefetch_queue_depth="),
    ("transform", lambda s: s, "decode='cpu'"), ("worker_init_fn", print, "no worker processes"),
    ("multiprocessing_context", "spawn", "no worker processes"), ("timeout", 5.0, "no worker processes"),
    ("decode_backend", "pillow", "nvJPEG"),
])
def test_cpu_options_dali_cannot_honour_say_why(name: str, value: object, hint: str) -> None:
    assert name in DALI_REFUSES
    key, f, _ = find_option(name)
    given = {name: value} if key is None else {key: {f.name: value}}
    with pytest.raises(ConfigError, match=rf"decode='dali' cannot honour {name}=.*{hint}"):
        loader_options(batch_size=4, **DALI, **given)
    loader_options(batch_size=4, decode="cpu", **ONE, **given)  # fine on the CPU path


def test_neutral_cpu_values_and_the_ones_dali_meets_are_accepted() -> None:
    o = loader_options(batch_size=4, **DALI, num_workers=0,
                       workers=fastfeed.Workers(prefetch_factor=None, timeout=0.0, pin_memory=True,
                                                persistent_workers=False, reuse_buffers=False))
    assert (o.num_workers, o.workers.prefetch_factor, o.workers.persistent_workers) == (0, None, False)
    assert set(DALI_MEETS) == {"pin_memory", "persistent_workers", "reuse_buffers"}


def test_options_are_checked_once_for_both_backends() -> None:
    for decode in ("cpu", "dali"):
        base = dict(decode=decode, image_size=16, **ONE)
        for kwargs, match in [({"batch_size": 0}, "batch_size=0"), ({"batch_size": True}, "batch_size"),
                              ({"seed": -1}, "seed=-1"), ({"order": {"shuffle_block": 0}}, "shuffle_block"),
                              ({"on_error": "ignore"}, "on_error='ignore'"),
                              ({"crop": {"scale": (0.5, 0.1)}}, r"Crop.scale=\(0.5, 0.1\)"),
                              ({"crop": {"ratio": 1}}, "Crop.ratio"),
                              ({"crop": {"fraction": 1.5}}, "Crop.fraction"), ({"image_size": (1, 2, 3)}, "image_size"),
                              ({"rank": 2, "world_size": 2}, "rank=2")]:
            args = {"batch_size": 4, **base, **kwargs}
            with pytest.raises(ConfigError, match=match):
                loader_options(**args)
    with pytest.raises(ConfigError, match="decode='gpu'"):
        loader_options(batch_size=4, decode="gpu", **ONE)
    with pytest.raises(ConfigError, match="needs batch_size"):
        loader_options(**ONE)


def test_dali_settings() -> None:
    with pytest.raises(ConfigError, match="decode='dali' needs image_size"):
        loader_options(batch_size=4, decode="dali", **ONE)
    for kwargs, match in [({"output": "int8"}, "output"), ({"layout": "CHW"}, "layout"),
                          ({"mean": (0.5, 0.5, 0.5)}, r"Dali\(mean=, std=\) normalise float"), ({"output": "float16", "std": (1, 0, 1)}, "std"),
                          ({"output": "float16", "mean": (1, 2)}, "mean"),
                          ({"hw_decoder_load": 1.5}, "hw_decoder_load"),
                          ({"hw_decoder_load": "0.5"}, "hw_decoder_load"), ({"num_threads": 0}, "num_threads"),
                          ({"prefetch_queue_depth": 1.5}, "prefetch_queue_depth"), ({"device_id": -1}, "device_id")]:
        with pytest.raises(ConfigError, match=match):  # a group is checked when it is built
            fastfeed.Dali(**kwargs)
        with pytest.raises(ConfigError, match=match):
            loader_options(batch_size=4, **DALI, dali=kwargs)
    f16 = loader_options(batch_size=4, **DALI, dali=fastfeed.Dali(output="float16", num_threads=None, device_id=None))
    assert f16.dali.mean == IMAGENET_MEAN and f16.dali.std is not None and f16.dali.num_threads == "auto"
    assert not f16.gpu
    assert check_dali_knobs({"num_threads": 3, "hw_decoder_load": 1}) == {"num_threads": 3, "hw_decoder_load": 1.0}


def test_the_defaults_are_loaders_and_the_options_are_frozen() -> None:
    params = inspect.signature(fastfeed.loader).parameters
    defaults = {f.name: f.default for f in dataclasses.fields(LoaderOptions)}
    for name, p in params.items():
        if p.kind is p.KEYWORD_ONLY and name not in GROUPS:
            assert defaults[name] == p.default, name
        if name in GROUPS:  # a group keyword: None is its default object
            assert p.default is None and defaults[name] == GROUPS[name]()
    assert set(params) - {"path", "former"} | {"knobs_from"} == set(defaults)
    assert len(FLAT) <= 17 and tuple(GROUPS) == ("crop", "workers", "dali", "storage", "tokens", "order")
    o = loader_options(batch_size=4, **ONE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.batch_size = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.crop.scale = (0.5, 1)  # type: ignore[misc]


def test_each_option_is_defined_once_and_its_doc_comes_from_there() -> None:
    """The docstrings of loader(), tune(), doctor() and the groups, DALI's rules and the former
    spellings all read the options' one definition (fastfeed._options)."""
    for key, cls in GROUPS.items():
        for f in dataclasses.fields(cls):
            spec = f.metadata["fastfeed"]
            assert spec.doc and spec.doc.split(";")[0] in " ".join(cls.__doc__.split()), (key, f.name)
            if spec.legacy != "":  # "": born in its group, no former spelling
                assert LEGACY[spec.legacy or f.name] == (key, f.name)
            else:
                assert f.name not in LEGACY or LEGACY[f.name] != (key, f.name)
    for name in FLAT:
        doc = LoaderOptions.__dataclass_fields__[name].metadata["fastfeed"].doc
        assert doc.split(";")[0] in " ".join(fastfeed.loader.__doc__.split()), name
    for fn in (fastfeed.tune, fastfeed.doctor):
        assert fastfeed.Crop.__name__ and "{loader options}" not in fn.__doc__ and "crop:" in fn.__doc__
    assert "{options}" not in fastfeed.loader.__doc__
    assert DALI_REFUSES["prefetch_factor"][0] == ("auto", None) and "num_workers" in DALI_REFUSES
    assert repr(fastfeed.Crop(flip=False)) == "Crop(flip=False)"  # only what differs from the defaults


@pytest.mark.parametrize("old,value,group,field", [
    ("crop_scale", (0.2, 1.0), "crop", "scale"), ("crop_fraction", 0.9, "crop", "fraction"),
    ("image_field", "png", "crop", "image_field"), ("prefetch_factor", 4, "workers", "prefetch_factor"),
    ("decode_backend", "pillow", "workers", "decode_backend"), ("storage_options", {"a": 1}, "storage", "options"),
    ("cache_size", "1GB", "storage", "cache_size"), ("shuffle_block", 64, "order", "shuffle_block"),
    ("epoch_samples", 10, "order", "epoch_samples"), ("pad_multiple", 8, "tokens", "pad_multiple"),
])
def test_a_former_spelling_works_with_a_future_warning_naming_the_new_one(old: str, value: object, group: str,
                                                                          field: str) -> None:
    cls = GROUPS[group].__name__
    with pytest.warns(FutureWarning, match=rf"loader\({old}=\) is the former spelling of "
                                           rf"{group}=fastfeed\.{cls}\({field}=\.\.\.\)"):
        o = loader_options(batch_size=4, **ONE, **{old: value})
    assert getattr(getattr(o, group), field) == getattr(GROUPS[group](**{field: value}), field)
    assert o == loader_options(batch_size=4, **ONE, **{group: {field: value}})
    with pytest.raises(ConfigError, match=rf"got {group}= and its former spelling {old}="):
        loader_options(batch_size=4, **ONE, **{old: value, group: GROUPS[group](**{field: value})})


def test_former_dali_spellings_and_dali_group_are_the_same_options() -> None:
    with pytest.warns(FutureWarning, match=r"dali=fastfeed\.Dali\(num_threads=\.\.\., device_id=\.\.\.\)"):
        old = loader_options(batch_size=4, **DALI, num_threads=2, device_id=None)
    assert old == loader_options(batch_size=4, **DALI, dali=fastfeed.Dali(num_threads=2, device_id=None))


def test_with_values_sets_options_by_their_flat_or_former_names_without_warning() -> None:
    o = with_values(loader_options(batch_size=4, **DALI), {"num_workers": 0, "num_threads": 3})
    assert (o.num_workers, o.dali.num_threads) == (0, 3)
    with pytest.raises(ConfigError, match="num_threads"):
        with_values(o, {"num_threads": 0})


def test_rank_and_world_size_are_resolved_at_the_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    o = loader_options(batch_size=4)
    assert (o.rank, o.world_size) == (2, 3)
    assert (loader_options(batch_size=4, rank=0, world_size=1).rank) == 0  # arguments beat the environment


def test_old_on_error_spelling_warns_and_means_raise() -> None:
    with pytest.warns(FutureWarning, match="'fail' is the old spelling of 'raise'"):
        assert loader_options(batch_size=4, on_error="fail", **ONE).on_error == "raise"


def test_drop_last_must_fill_a_batch_per_rank() -> None:
    o = loader_options(batch_size=8, drop_last=True, rank=0, world_size=4)
    o.check_fits(32)
    with pytest.raises(ConfigError, match="31 samples over world_size=4 cannot fill one batch of 8.*drop_last=False"):
        o.check_fits(31)
    loader_options(batch_size=8, rank=0, world_size=4).check_fits(1)  # drop_last=False repeats samples


def test_normalize_image_size_is_the_one_reading_of_image_size() -> None:
    assert normalize_image_size(224) == (224, 224) and normalize_image_size(np.int64(5)) == (5, 5)
    assert normalize_image_size((160, 128)) == normalize_image_size([160, 128]) == (160, 128)
    assert normalize_image_size(None) is None
    for bad in (0, (1, 2, 3), "224", True, (16.5, 3), (0, 4), (True, 4)):
        with pytest.raises(ConfigError, match="image_size"):
            normalize_image_size(bad)  # type: ignore[arg-type]
    import fastfeed.decode.cpu as cpu
    import fastfeed.knobs.record as tuned

    assert cpu.normalize_image_size is tuned.normalize_image_size is normalize_image_size


def test_the_dali_backend_never_imports_loading_api() -> None:
    """loading.api imports the DALI backend, never the reverse (function-local imports included)."""
    root = Path(fastfeed.__file__).parent / "loading" / "dali"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith("fastfeed.loading.api") for n in names), path


def test_dali_reads_one_packed_dataset_not_a_list_of_tars() -> None:
    with pytest.raises(ConfigError, match="decode='dali' reads packed datasets.*not a list of tars.*fastfeed pack"):
        fastfeed.loader(["a.tar", "b.tar"], batch_size=4, decode="dali", image_size=16)


def test_the_new_modules_export_a_sorted_all() -> None:
    import fastfeed.loading.groups as groups
    import fastfeed.loading.options as options
    import fastfeed.loading.order.cursor as cursor
    import fastfeed.loading.sources as sources

    for module in (cursor, options, groups, sources):
        assert module.__all__ == sorted(module.__all__) and all(hasattr(module, n) for n in module.__all__)


def test_mixing_selection_and_pad_options_are_checked_once() -> None:
    keep = lambda m: m["index"] < 3  # noqa: E731
    o = loader_options(batch_size=4, rank=0, world_size=1, pad=0, order=fastfeed.Order(epoch_samples=100))
    assert o.order.epoch_samples == 100 and o.pad is False
    sources = as_sources(["a", "b"], weights=[7, 3], filter=[None, keep], subset=[None, [1, 2]])
    assert sources == (fastfeed.Source("a", weight=7.0), fastfeed.Source("b", weight=3.0, subset=[1, 2], filter=keep))
    for bad, match in (({"weights": [1, 0]}, "one positive number"), ({"weights": "ab"}, "one positive"),
                       ({"weights": [1, float("inf")]}, "one positive"), ({"weights": []}, "one positive"),
                       ({"filter": [None, "x"]}, "not callable")):
        with pytest.raises(ConfigError, match=match):
            as_sources(["a", "b"], **bad)
    for bad, match in (({"epoch_samples": 0}, "epoch_samples=0 must be an integer >= 1"),
                       ({"epoch_samples": 2.5}, "epoch_samples")):
        with pytest.raises(ConfigError, match=match):
            fastfeed.Order(**bad)
    for bad, match in (({"weight": 0}, r"weight=0\): give a positive number"), ({"weight": "x"}, "positive number"),
                       ({"filter": 3}, "not callable")):
        with pytest.raises(ConfigError, match=match):
            fastfeed.Source("a", **bad)
    with pytest.raises(ConfigError, match=r"has no weight; give every Source a weight="):
        as_sources([fastfeed.Source("a", weight=1), fastfeed.Source("b")])
    with pytest.raises(ConfigError, match="describe the datasets; pass them as loader"):
        loader_options(batch_size=4, rank=0, world_size=1, weights=[1, 1])
    with pytest.warns(FutureWarning, match=r"loader\(weights=\) is the former spelling of loader\(\[fastfeed\.Source"):
        with pytest.raises(ConfigError, match="1 entries for 2 dataset"):
            fastfeed.loader([NOWHERE, NOWHERE], batch_size=4, weights=[1])
