"""decode="dali" with ``num_pipelines``: N pipelines fed in turn from one epoch plan, run CPU-only here.

What must not depend on N: the batches (keys, labels, pixels of evaluation crops), their
order over epochs, abandoned passes, ``set_epoch``, resume (``state_dict`` from one N
loaded with another) and skipped samples. What must not happen: a rebuild of the
pipelines for ``set_epoch``, ``load_state_dict`` or a new pass (only the first batch,
``close()`` and a failed pipeline build them).
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch

from loading.dali._dali_data import corrupt_samples, dali_cpu, require_dali, tar_dataset, write_image_folder
from tools.synth import make_jpeg

import fastfeed
from fastfeed.errors import ConfigError
from fastfeed.loading.dali.backend import DEFAULTS, TUNE_SPACE
from fastfeed.loading.dali.graph import split_threads
from fastfeed.loading.dali.reuse import parked, pipeline_key, release_parked
from fastfeed.loading.options import DALI_ONLY
from fastfeed.packed.index import DatasetIndex

pytestmark = pytest.mark.dali


@pytest.fixture(scope="module")
def dali() -> Any:
    return require_dali()


@pytest.fixture(autouse=True)
def _isolated(isolated_store: Path) -> Iterator[None]:
    """Tune results of a test never reach the user's cache; no test adopts another's pipelines."""
    gc.collect()
    release_parked()
    yield
    gc.collect()
    release_parked()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """26 images of varied sizes in 5 shards: 7 batches of 4, a number 2 and 3 do not divide
    (the turn of the pipelines runs across epoch ends)."""
    rng = np.random.default_rng(5)
    sizes = [(int(rng.integers(30, 70)), int(rng.integers(30, 70))) for _ in range(26)]
    base = tmp_path_factory.mktemp("dali_pipes")
    src = write_image_folder(base / "src", sizes)
    fastfeed.pack(src, base / "ff", samples_per_shard=6)
    return base / "ff"


def _loader(root: Path, n: int, **kw: Any) -> Any:
    """A CPU-only DALI loader of ``n`` pipelines; the fields of fastfeed.Dali in ``kw`` change DALI_CPU's."""
    args: dict[str, Any] = dict(batch_size=4, image_size=16, augment=False, seed=3)
    args.update(kw, num_pipelines=n)
    return fastfeed.loader(str(root), **dali_cpu(**args))


def _batches(dl: Any) -> list[tuple[list[str], list[int], torch.Tensor]]:
    return [(b["__key__"], b["label"].tolist(), b["image"].clone()) for b in dl]


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        ka == kb and la == lb and torch.equal(xa, xb) for (ka, la, xa), (kb, lb, xb) in zip(a, b))


@pytest.fixture(scope="module")
def reference(dali: Any, packed: Path) -> dict[int, list[Any]]:
    """One pipeline's batches of epochs 0..4 (epochs run back to back, then set_epoch(4))."""
    gc.collect()  # module-scoped, so before _isolated: no pipeline parked by an earlier test module
    release_parked()
    dl = _loader(packed, 1)
    out = {e: _batches(dl) for e in range(3)}
    dl.set_epoch(4)
    out[4] = _batches(dl)
    assert dl._builds == 1 and len(out[0]) == len(dl) == 7
    return out


# ---------------------------------------------------------------------- the same batches
@pytest.mark.parametrize("n", [2, 3])
def test_n_pipelines_give_the_batches_of_one(dali: Any, packed: Path, reference: dict[int, list[Any]],
                                             n: int) -> None:
    dl = _loader(packed, n)
    for epoch in range(3):  # epoch after epoch without set_epoch: the stream crosses epoch ends
        assert _same(_batches(dl), reference[epoch]), epoch
    assert len(dl._pipes) == n and dl._builds == 1
    assert [p.num_threads for p in dl._pipes] == [1] * n  # num_threads=1 shared: one each at least


def test_abandoned_passes_and_set_epoch_keep_the_pipelines(dali: Any, packed: Path,
                                                          reference: dict[int, list[Any]]) -> None:
    dl = _loader(packed, 2, prefetch_queue_depth=3)
    it = iter(dl)
    head = [next(it) for _ in range(3)]  # batches 3.. of both pipelines are in flight
    assert _same([(b["__key__"], b["label"].tolist(), b["image"]) for b in head], reference[0][:3])
    it.close()  # abandoned: the next pass is epoch 1, as on the CPU path
    assert _same(_batches(dl), reference[1])
    dl.set_epoch(4)
    assert _same(_batches(dl), reference[4])
    dl.set_epoch(0)
    it = iter(dl)
    next(it)
    again = iter(dl)  # a new iter() mid-pass runs the next epoch
    assert _same(_batches(again), reference[1])
    assert dl._builds == 1 and len(dl._pipes) == 2


@pytest.mark.parametrize("saved_n,loaded_n,stop", [(1, 2, 3), (2, 3, 1), (3, 1, 5), (2, 2, 6)])
def test_resume_mid_epoch_with_another_num_pipelines(dali: Any, packed: Path, reference: dict[int, list[Any]],
                                                     saved_n: int, loaded_n: int, stop: int) -> None:
    dl = _loader(packed, saved_n)
    dl.set_epoch(1)
    it = iter(dl)
    for _ in range(stop):
        next(it)
    state = dl.state_dict()
    fresh = _loader(packed, loaded_n)
    fresh.load_state_dict(state)
    assert _same(_batches(fresh), reference[1][stop:])
    assert _same(_batches(fresh), reference[2])
    # the saving loader itself resumes there again, with the pipelines it has
    dl.load_state_dict(state)
    assert _same(_batches(dl), reference[1][stop:])
    assert dl._builds == 1 and fresh._builds == 1


def test_close_releases_the_pipelines_and_the_next_pass_builds_them(dali: Any, packed: Path,
                                                                   reference: dict[int, list[Any]]) -> None:
    dl = _loader(packed, 2)
    it = iter(dl)
    next(it)
    dl.close()
    assert dl._pipes == [] and dl._pipe is None and not dl._feeder.pending
    assert _same(_batches(dl), reference[1]) and dl._builds == 2


def test_a_failed_build_stops_the_started_pipelines_and_the_next_pass_builds_again(
        dali: Any, packed: Path, reference: dict[int, list[Any]]) -> None:
    from types import SimpleNamespace

    from fastfeed.loading.dali.backend import import_dali
    from fastfeed.loading.dali.pipeline import DaliLoader

    d = import_dali()
    made: list[Any] = []

    def pipeline(**kw: Any) -> Any:
        if len(made) == 1:  # the second pipeline of the first set cannot be built
            made.append(None)
            raise RuntimeError("no memory for a second pipeline")
        made.append(weakref.ref(p := d.Pipeline(**kw)))
        return p

    ref = _loader(packed, 2)
    dl = DaliLoader(ref.index, ref.options, dali=SimpleNamespace(**{**vars(d), "Pipeline": pipeline}))
    with pytest.raises(RuntimeError, match="second pipeline") as failed:
        next(iter(dl))
    gc.collect()  # the traceback (kept in ``failed``) holds the frames, not the started pipeline
    assert failed.tb is not None
    assert dl._pipes == [] and not dl._feeder.pending and made[0]() is None
    dl.set_epoch(0)
    assert _same(_batches(dl), reference[0]) and dl._builds == 2 and len(dl._pipes) == 2


def test_augmented_crops_are_seeded_per_pipeline(dali: Any, packed: Path) -> None:
    """Random crops come from each pipeline's generator: the same for the same N, and the
    keys the same for every N."""
    a, b, one = (_loader(packed, n, augment=True) for n in (2, 2, 1))
    ba, bb, b1 = _batches(a), _batches(b), _batches(one)
    assert _same(ba, bb)
    assert [k for k, _, _ in ba] == [k for k, _, _ in b1]
    assert torch.equal(ba[0][2], b1[0][2])  # pipeline 0 is seeded as a single pipeline is
    assert not torch.equal(ba[1][2], b1[1][2])  # batch 1 is pipeline 1's: its own generator


# ---------------------------------------------------------------------- the next loader
def test_a_dropped_loaders_pipelines_serve_the_next_loader(dali: Any, packed: Path, tmp_path: Path,
                                                          reference: dict[int, list[Any]]) -> None:
    a = _loader(packed, 2)
    it = iter(a)
    next(it), next(it)  # batches 2.. are in flight when a is dropped
    ids = [id(p) for p in a._pipes]
    b = _loader(packed, 2)  # a lives: b builds its own
    assert _same(_batches(b), reference[0]) and (b._builds, b._adopted) == (1, 0)
    assert set(ids).isdisjoint(id(p) for p in b._pipes)
    del it, a
    gc.collect()
    assert parked() == 1
    c = _loader(packed, 2, seed=3)
    c.set_epoch(1)
    assert _same(_batches(c), reference[1])  # a's batches in flight were dropped
    assert (c._builds, c._adopted) == (0, 1) and [id(p) for p in c._pipes] == ids and parked() == 0
    del c
    gc.collect()
    # the dataset is not part of the pipelines: a loader of another one adopts them too
    rng = np.random.default_rng(0)
    other = tar_dataset(tmp_path / "other", [(f"o{i}", {"jpg": make_jpeg(rng, (20, 30)), "cls": b"1"})
                                             for i in range(9)], 4)
    d = _loader(other, 2, shuffle=False)
    assert [k for k, _, _ in _batches(d)] == [["o0", "o1", "o2", "o3"], ["o4", "o5", "o6", "o7"], ["o8"]]
    assert (d._builds, d._adopted) == (0, 1) and [id(p) for p in d._pipes] == ids


def test_only_the_same_shape_adopts_close_parks_nothing_and_one_set_is_kept(dali: Any, packed: Path) -> None:
    a = _loader(packed, 2)
    next(iter(a))
    first = [weakref.ref(p) for p in a._pipes]
    del a
    gc.collect()
    for kw in ({"num_pipelines": 1}, {"image_size": 24}, {"num_threads": 2}, {"batch_size": 3}):
        n = kw.pop("num_pipelines", 2)
        other = _loader(packed, n, **kw)
        next(iter(other))
        assert (other._builds, other._adopted) == (1, 0), kw
        other.close()
    assert parked() == 1 and pipeline_key(_loader(packed, 2).options) == pipeline_key(_loader(packed, 2, seed=9).options)
    d = _loader(packed, 2)
    next(iter(d))
    assert d._adopted == 1 and [id(p) for p in d._pipes] == [id(r()) for r in first]
    d.close()  # released, not parked
    del d
    gc.collect()
    assert parked() == 0 and all(r() is None for r in first)
    e, f = _loader(packed, 2), _loader(packed, 3)
    next(iter(e)), next(iter(f))
    old = [weakref.ref(p) for p in e._pipes]
    del e
    gc.collect()
    del f  # parked after e's: e's pipelines are released (one set is kept)
    gc.collect()
    assert parked() == 1 and all(r() is None for r in old)
    release_parked()
    assert parked() == 0
    g = _loader(packed, 2, augment=True)  # draws random numbers: never handed on
    next(iter(g))
    del g
    gc.collect()
    assert parked() == 0


def test_the_reuse_key_covers_every_option_the_graph_reads() -> None:
    import dataclasses
    import inspect
    import re

    from fastfeed.loading.dali import graph, reuse
    from fastfeed.loading.options import LoaderOptions

    read = set(re.findall(r"\bo\.([a-z_]+)", inspect.getsource(graph)))
    # seed, rank: only the augmentation's generators (never reused); gpu: device_id
    assert read - {"seed", "rank", "gpu"} <= set(reuse._KEY_FIELDS)
    assert set(reuse._KEY_FIELDS) <= {f.name for f in dataclasses.fields(LoaderOptions)}


def test_a_forked_child_forgets_the_parked_pipelines(dali: Any, packed: Path) -> None:
    import os
    import warnings

    a = _loader(packed, 2)
    next(iter(a))
    del a
    gc.collect()
    assert parked() == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a process with threads
        pid = os.fork()
    if pid == 0:  # the child: nothing to adopt, and nothing destroyed on the way out
        os._exit(0 if parked() == 0 else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and parked() == 1


# ---------------------------------------------------------------------- bad samples
def test_skip_gives_the_same_batches_for_every_n(dali: Any, tmp_path: Path) -> None:
    root = tar_dataset(tmp_path / "ff", corrupt_samples(), 6)
    got = {}
    for n in (1, 2, 3):
        dl = fastfeed.loader(str(root), batch_size=3, image_size=16, augment=False, seed=1, on_error="skip",
                             **dali_cpu(num_pipelines=n))
        got[n] = [_batches(dl) for _ in range(2)]
        assert dl.stats.skipped == 4  # k005 (DALI cannot decode it) twice, k009 (no image) twice
        assert any("k005" in m for m in dl.stats.skip_messages)
        assert dl._builds == 2  # the failed pipeline set was rebuilt once, the second epoch needs none
    keys = {k for b in got[1][0] for k in b[0]}
    assert keys == {f"k{i:03d}" for i in range(14)} - {"k005", "k009"}
    assert _same(got[2][0] + got[2][1], got[1][0] + got[1][1])
    assert _same(got[3][0] + got[3][1], got[1][0] + got[1][1])


# ---------------------------------------------------------------------- options and tune
def test_num_pipelines_is_validated_once(dali: Any, packed: Path) -> None:
    for bad in (0, -1, 1.5, "two", True):
        with pytest.raises(ConfigError, match="num_pipelines"):
            _loader(packed, bad)
    with pytest.raises(ConfigError, match="num_pipelines=2.*decode='dali'"):
        fastfeed.loader(str(packed), batch_size=4, decode="cpu", dali=fastfeed.Dali(num_pipelines=2))
    dl = _loader(packed, 2, num_threads=5)
    next(iter(dl))
    assert [p.num_threads for p in dl._pipes] == split_threads(5, 2) == [3, 2]
    assert "num_pipelines=2" in repr(dl)


def test_auto_takes_num_pipelines_from_the_tune_result(dali: Any, packed: Path) -> None:
    from fastfeed.host import host_info
    from fastfeed.knobs.record import TuneKey, TuneRecord, save_record

    args = dict(batch_size=4, image_size=16, decode="dali", dali=fastfeed.Dali(device_id=None))
    dl = fastfeed.loader(str(packed), **args)
    assert dl.options.dali.num_pipelines == DEFAULTS["num_pipelines"] == 1 and dl.options.knobs_from == "default"
    idx = DatasetIndex.load(packed)
    key = TuneKey(idx.fingerprint, host_info(), 1, 4, "dali", (16, 16))
    save_record(TuneRecord(key, 0, None, {"num_threads": 2, "hw_decoder_load": 0.9, "prefetch_queue_depth": 2,
                                          "num_pipelines": 2}, 1000.0, "2026-01-01"), str(packed))
    dl = fastfeed.loader(str(packed), **args)
    assert (dl.options.dali.num_pipelines, dl.options.knobs_from) == (2, "tuned")
    assert len(list(dl)) == 7 and len(dl._pipes) == 2
    explicit = fastfeed.loader(str(packed), **{**args, "dali": fastfeed.Dali(device_id=None, num_pipelines=1)})
    assert explicit.options.dali.num_pipelines == 1  # explicit wins
    # an older tune result without the knob: the default
    save_record(TuneRecord(key, 0, None, {"num_threads": 2, "hw_decoder_load": 0.9, "prefetch_queue_depth": 2},
                           1000.0, "2026-01-02"), str(packed))
    assert fastfeed.loader(str(packed), **args).options.dali.num_pipelines == 1


def test_tune_space_searches_one_and_two_pipelines(dali: Any, packed: Path) -> None:
    from dataclasses import replace

    from fastfeed.timing.measure import measure
    from fastfeed.tuning.search import search

    knob = next(k for k in TUNE_SPACE.knobs if k.name == "num_pipelines")
    assert knob.candidates(16) == (1, 2) and knob.default == 1 and not knob.uses_cores
    assert "num_pipelines" in DALI_ONLY
    assert TUNE_SPACE.knobs[-1] is knob  # searched last, at the threads found (shared between them)

    built: list[int] = []

    def measure_fn(setting: Any) -> Any:  # the real loader at each setting, as `fastfeed tune` runs it
        knobs = dict(setting.knobs)
        dl = _loader(packed, knobs.pop("num_pipelines"), **knobs)
        m = measure(lambda: iter(dl), min_batches=2, min_time=0.0, max_time=0.5, settle=0.0)
        built.append(len(dl._pipes))
        return m

    out = search(measure_fn, cores=2, space=replace(TUNE_SPACE, knobs=(knob,)), time_budget=8.0)
    tried = {dict(t.setting.knobs)["num_pipelines"] for t in out.trials if t.ok}
    assert tried == {1, 2} == set(built) and dict(out.best.setting.knobs)["num_pipelines"] in (1, 2)
