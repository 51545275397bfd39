"""Wrong types and absurd values at every public function: a FastfeedError naming the argument, nothing else.

A sweep (hypothesis, deterministic): each public function, each of its arguments in turn given None,
bools, strings, huge and negative integers, nan and inf, lists, dicts and numpy scalars while the
others keep working values. Whatever it does, the only exceptions that may escape are
:class:`~fastfeed.errors.FastfeedError` s (``ConfigError`` is a ``ValueError`` too, and so on): never a
``TypeError``, an ``OverflowError`` or a ``MemoryError`` from deep inside. The heavy part of ``tune``,
``doctor`` and ``pack`` (measuring, writing shards) is replaced by a marker: the sweep is about what
happens before it, at the boundary.
"""

from __future__ import annotations

import inspect
import itertools
import math
import re
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fastfeed  # noqa: E402
from _pack_data import write_messy_folder  # noqa: E402
from fastfeed.errors import ConfigError, FastfeedError, StateError  # noqa: E402
from fastfeed.sampling.aspect import DistributedAspectRatioSampler  # noqa: E402

#: Deterministic and quick: no example database, no shrinking (a failure names its value as found).
SWEEP = settings(max_examples=4, deadline=None, derandomize=True, database=None, print_blob=False,
                 phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: What a careless caller passes.
BAD = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=6),
    st.sampled_from(["", "auto", "0", "-1", "1e309", "nan", "64GB", "x" * 300]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**31, 2**63, 2**64, -(2**63), 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([np.int64(-1), np.uint64(2**63), np.float32("nan"), np.float64(1e300), np.bool_(True),
                     np.int32(7), np.float64("inf")]),
)


#: Tried first by every sweep, whatever hypothesis draws after them.
EXTREMES = (None, True, "x", -1, 2**63, 10**400, math.nan, -math.inf, [], {}, np.uint64(2**63))


def sweep(test: Callable[..., None]) -> Callable[..., None]:
    """``test(..., value)`` run on :data:`EXTREMES`, then on values drawn from :data:`BAD`."""
    for v in reversed(EXTREMES):
        test = example(value=v)(test)
    return SWEEP(given(value=BAD)(test))


class Reached(Exception):
    """The call got past its checks to the part the sweep replaces (measuring, writing)."""


def _raise_reached(*_: Any, **__: Any) -> Any:
    raise Reached


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Call ``fn``; only a FastfeedError (or the marker) may escape."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sweep is about exceptions; warnings are other tests' business
        try:
            out = fn(*args, **kwargs)
        except (FastfeedError, Reached):
            return
        except Exception as e:  # noqa: BLE001 - the point of the sweep
            shown = ", ".join([*map(_short, args), *(f"{k}={_short(v)}" for k, v in kwargs.items())])
            where = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_tb(e.__traceback__)
                     if "fastfeed" in f.filename][-3:]
            pytest.fail(f"{getattr(fn, '__qualname__', fn)}({shown}) raised {type(e).__name__}: {e} (at {where})")
        close = getattr(out, "close", None)
        if callable(close):
            close()


def _short(v: Any) -> str:
    text = " ".join(repr(v).split())
    return text if len(text) < 80 else text[:77] + "..."


# ---------------------------------------------------------------- data
@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep-src")
    write_messy_folder(root)
    return root


@pytest.fixture(scope="module")
def ds(src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("sweep-ds") / "ds"
    fastfeed.pack(src, dst, samples_per_shard=4, workers=1)
    return dst


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Path]]:
    """A new destination folder name for every call."""
    root = tmp_path_factory.mktemp("sweep-dst")
    counter = itertools.count()
    yield lambda: root / f"d{next(counter)}"


@pytest.fixture(scope="module")
def no_heavy_work() -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setattr("fastfeed.tuning.api.search", _raise_reached)
    mp.setattr("fastfeed.diagnosis.api._measure", _raise_reached)
    mp.setattr("fastfeed.packing.api.run_local", _raise_reached)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run in a scratch folder: a relative DST such as ``"0"`` is created where the test runs."""
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp_path_factory.mktemp("sweep-cwd"))
    yield
    mp.undo()


LENGTHS = np.arange(1, 65)
SIZES = np.stack([np.full(64, 96), np.arange(32, 96)], 1)


def _params(fn: Callable[..., Any], skip: tuple[str, ...] = ()) -> list[str]:
    """``fn``'s argument names (those a caller can pass by keyword), less ``skip``."""
    return [n for n, p in inspect.signature(fn).parameters.items()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n not in skip]


def _param(*values: Any) -> Any:
    """One case of a sweep, its id the values joined (a function by its name)."""
    return pytest.param(*values, id="-".join(getattr(v, "__name__", str(v)) for v in values))


# ---------------------------------------------------------------- the front doors
@pytest.mark.parametrize("name", _params(fastfeed.loader, skip=("path",)))
@sweep
def test_loader(ds: Path, name: str, value: Any) -> None:
    _call(fastfeed.loader, str(ds), **{"batch_size": 2, "num_workers": 0, name: value})


@pytest.mark.parametrize("name", _params(fastfeed.pack, skip=("src", "dst")))
@sweep
def test_pack(src: Path, fresh: Callable[[], Path], no_heavy_work: None, elsewhere: None, name: str,
              value: Any) -> None:
    _call(fastfeed.pack, str(src), str(fresh()), **{"samples_per_shard": 4, name: value})


@pytest.mark.parametrize("name", _params(fastfeed.tune, skip=("path",)))
@sweep
def test_tune(ds: Path, tmp_path: Path, no_heavy_work: None, name: str, value: Any) -> None:
    _call(fastfeed.tune, str(ds), **{"batch_size": 2, "store_dir": str(tmp_path), name: value})


@pytest.mark.parametrize("name", _params(fastfeed.doctor, skip=("path",)))
@sweep
def test_doctor(ds: Path, no_heavy_work: None, name: str, value: Any) -> None:
    _call(fastfeed.doctor, str(ds), **{"batch_size": 2, name: value})


@pytest.mark.parametrize("name", _params(fastfeed.verify, skip=("dst",)))
@sweep
def test_verify(ds: Path, name: str, value: Any) -> None:
    _call(fastfeed.verify, str(ds), **{name: value})


@pytest.mark.parametrize("fn", [pytest.param(f, id=f.__name__) for f in (fastfeed.info, fastfeed.verify,
                                                                       fastfeed.loader, fastfeed.tune,
                                                                       fastfeed.doctor)])
@sweep
def test_the_path_itself(fn: Callable[..., Any], no_heavy_work: None, value: Any) -> None:
    _call(fn, value)


@pytest.mark.parametrize("which", ["src", "dst"])
@sweep
def test_the_paths_of_pack(src: Path, fresh: Callable[[], Path], no_heavy_work: None, elsewhere: None, which: str,
                           value: Any) -> None:
    if which == "src":
        _call(fastfeed.pack, value, str(fresh()), samples_per_shard=4)
    else:
        _call(fastfeed.pack, str(src), value, samples_per_shard=4)


# ---------------------------------------------------------------- samplers
SAMPLERS: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = {
    "length_bucket": (fastfeed.DistributedLengthBucketSampler, (LENGTHS,),
                      {"batch_size": 4, "num_replicas": 2, "rank": 0}),
    "token_budget": (fastfeed.DistributedTokenBudgetSampler, (LENGTHS,), {"max_cost": 200, "num_replicas": 2, "rank": 0}),
    "aspect_ratio": (DistributedAspectRatioSampler, (SIZES,),
                     {"resolution": 64, "batch_size": 4, "num_replicas": 2, "rank": 0}),
}
SAMPLER_ARGS = [_param(kind, name) for kind, (cls, _, _) in SAMPLERS.items()
                for name in _params(cls)]


@pytest.mark.parametrize(("kind", "name"), SAMPLER_ARGS)
@sweep
def test_sampler_constructors(kind: str, name: str, value: Any) -> None:
    cls, args, kwargs = SAMPLERS[kind]
    first = _params(cls)[0]
    if name == first:
        _call(cls, value, **kwargs)
    else:
        _call(cls, *args, **{**kwargs, name: value})


@pytest.mark.parametrize("kind", SAMPLERS)
@sweep
def test_sampler_set_epoch_and_state(kind: str, value: Any) -> None:
    cls, args, kwargs = SAMPLERS[kind]
    sampler = cls(*args, **kwargs)
    _call(sampler.set_epoch, value)
    _call(sampler.load_state_dict, {**sampler.state_dict(), "epoch": value})
    _call(sampler.load_state_dict, {**sampler.state_dict(), "step": value})


@pytest.mark.parametrize("kind", SAMPLERS)
@pytest.mark.parametrize("epoch", [2**63, 2**64, 10**30, np.uint64(2**63), -1])
def test_set_epoch_of_a_huge_epoch_is_a_config_error(kind: str, epoch: Any) -> None:
    cls, args, kwargs = SAMPLERS[kind]
    sampler = cls(*args, **kwargs)
    with pytest.raises(ConfigError, match=r"set_epoch\(.*\): the epoch is an integer from 0 to 2\*\*62"):
        sampler.set_epoch(epoch)
    state = sampler.state_dict()
    with pytest.raises(StateError, match=f"epoch={int(epoch)} is not an integer (from 0 to|>= 0)"):
        cls(*args, **kwargs).load_state_dict({**state, "epoch": int(epoch)})
    sampler.set_epoch(2**62)  # the largest epoch works, start to end
    assert sum(len(b) for b in sampler) > 0


def test_loader_set_epoch_of_a_huge_epoch(ds: Path) -> None:
    dl = fastfeed.loader(str(ds), batch_size=2, num_workers=0)
    try:
        with pytest.raises(ConfigError, match="the epoch is an integer from 0 to 2"):
            dl.set_epoch(2**63)
        with pytest.raises(StateError):
            dl.load_state_dict({**dl.state_dict(), "epoch": 2**63})
    finally:
        getattr(dl, "close", lambda: None)()


# ---------------------------------------------------------------- option groups and the step monitor
GROUPS = [fastfeed.Workers, fastfeed.Crop, fastfeed.Storage, fastfeed.Dali, fastfeed.Tokens, fastfeed.Order,
          fastfeed.StepMonitor]
GROUP_ARGS = [_param(g, n) for g in GROUPS for n in _params(g)]


@pytest.mark.parametrize(("group", "name"), GROUP_ARGS)
@sweep
def test_option_groups_and_step_monitor(group: type, name: str, value: Any) -> None:
    _call(group, **{name: value})


def test_the_sweep_sees_bad_values() -> None:
    """The strategy reaches the values the issue names (kept honest if BAD is edited)."""
    assert math.isnan(float(np.float32("nan"))) and 2**63 > np.iinfo(np.int64).max


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"image_size": 100000}, "image_size"),  # a 30 GB allocation attempt, once
    ({"image_size": (64, 100000)}, "image_size"),
    ({"rank": "0"}, "rank='0'"),
    ({"world_size": 2**63}, "world_size"),
])
def test_the_issues_cases_at_the_loader(ds: Path, kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        fastfeed.loader(str(ds), batch_size=2, num_workers=0, **kwargs)


@pytest.mark.parametrize(("fn", "kwargs", "words"), [
    ("tune", {"step_time": "x"}, "step_time='x' must be a number > 0 (seconds per batch)"),
    ("tune", {"max_workers": []}, "max_workers=[] must be an integer >= 0"),
    ("tune", {"trial_time": 10**400}, "trial_time=1000"),
    ("tune", {"plot": 0}, "plot=0 must be a path"),
    ("tune", {"loader_kwargs": 1.5}, "loader_kwargs=1.5 must be a dict of options"),
    ("tune", {"time_budget": 10**400}, "write a finite number of seconds"),
    ("doctor", {"source": 2**64}, f"source={2**64} must be a path"),
    ("doctor", {"target_rate": []}, "target_rate=[] must be a number > 0 (samples/s per rank)"),
    ("doctor", {"world_size": "nan"}, "world_size='nan' must be an integer >= 1"),
    ("doctor", {"loader_kwargs": "x"}, "loader_kwargs='x' must be a dict of options"),
    ("doctor", {"image_size": 10**400}, "more than a million GB"),
])
def test_tune_and_doctor_name_the_argument(ds: Path, tmp_path: Path, no_heavy_work: None, fn: str,
                                           kwargs: dict[str, Any], words: str) -> None:
    more = {"store_dir": str(tmp_path)} if fn == "tune" else {}
    with pytest.raises(ConfigError, match=re.escape(words)):
        getattr(fastfeed, fn)(str(ds), batch_size=2, **more, **kwargs)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"max_ratio": 2**63}, f"max_ratio={2**63} must be a number from 1 to 64"),  # once: buckets until out of memory
    ({"max_ratio": math.inf}, "max_ratio=inf must be a number from 1 to 64"),
    ({"resolution": None}, "resolution=None must be a positive integer (pixels) up to 8192"),
    ({"step": 10**30}, f"step={10**30} must be a positive integer (pixels) up to 8192"),
    ({"batch_size": 10**30}, f"batch_size={10**30} must be a positive integer up to {2**40}"),
    ({"max_upscale": 10**400}, "must be a number >= 1 and finite"),
])
def test_the_aspect_sampler_bounds(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        DistributedAspectRatioSampler(SIZES, **{"resolution": 64, "batch_size": 4, "num_replicas": 1, "rank": 0,
                                                **kwargs})


def test_the_bucket_side_bound_is_the_decoders() -> None:
    from fastfeed.decode.geometry import MAX_IMAGE_SIDE
    from fastfeed.sampling.buckets import MAX_SIDE

    assert MAX_SIDE == MAX_IMAGE_SIDE


@pytest.mark.parametrize(("group", "kwargs", "words"), [
    (fastfeed.Workers, {"timeout": 10**400}, "Workers.timeout=1000"),
    (fastfeed.Storage, {"cache_size": 10**400}, "write a finite number of bytes"),
    (fastfeed.Dali, {"hw_decoder_load": 10**400}, "must be in [0, 1]"),
    (fastfeed.Crop, {"fraction": 10**400}, "must be in (0, 1]"),
    (fastfeed.StepMonitor, {"timeout": 10**400}, "at most 604800 (a week)"),
    (fastfeed.StepMonitor, {"jsonl": 0.0}, "StepMonitor.jsonl=0.0 must be a path"),
])
def test_huge_numbers_in_groups_are_config_errors(group: type, kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        group(**kwargs)
