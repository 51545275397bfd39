"""decode="dali": a pipeline that never returns is reported (log) or raised (StallError), not waited for forever.

The pipelines are DALI's own (CPU-only here); the fault is injected around one of them:
from its third output on, ``share_outputs`` blocks until the test lets it go, as a pipeline
whose threads or GPU hang would.
"""

from __future__ import annotations

import gc
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import fastfeed
from fastfeed.errors import StallError
from fastfeed.loading.dali import pipeline as dali_pipeline
from fastfeed.loading.dali.reuse import release_parked
from loading.dali._dali_data import dali_cpu, require_dali, write_image_folder

pytestmark = pytest.mark.dali


class Hang:
    """Wraps the pipelines the loader builds: the chosen output of the first never comes until released."""

    def __init__(self, at: int) -> None:
        self.at, self.calls, self.release = at, 0, threading.Event()
        self.built: list[Any] = []

    def wrap(self, pipe: Any) -> Any:
        hang = self

        class Stuck:
            def __getattr__(self, name: str) -> Any:
                return getattr(pipe, name)

            def share_outputs(self) -> Any:
                hang.calls += 1
                if len(hang.built) == 1 and hang.calls == hang.at:
                    hang.release.wait(60)
                return pipe.share_outputs()

        stuck = Stuck()
        self.built.append(stuck)
        return stuck


@pytest.fixture
def hang(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hang]:
    require_dali()
    h = Hang(at=3)
    real = dali_pipeline.build_pipeline
    monkeypatch.setattr(dali_pipeline, "build_pipeline", lambda *a, **k: h.wrap(real(*a, **k)))
    release_parked()
    yield h
    h.release.set()
    gc.collect()
    release_parked()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(3)
    base = tmp_path_factory.mktemp("dali_stall")
    src = write_image_folder(base / "src", [(int(rng.integers(30, 60)), int(rng.integers(30, 60))) for _ in range(24)])
    fastfeed.pack(src, base / "ff", samples_per_shard=8)
    return base / "ff"


def _loader(root: Path, **workers: Any) -> Any:
    return fastfeed.loader(str(root), **dali_cpu(batch_size=4, image_size=16, augment=False, shuffle=False,
                                                 workers=fastfeed.Workers(**workers)))


def test_a_pipeline_that_does_not_return_is_named_and_the_loop_goes_on_when_it_does(
        packed: Path, hang: Hang, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fastfeed.loading.dali.wait")
    threading.Timer(1.6, hang.release.set).start()
    keys = [b["__key__"] for b in _loader(packed, stall_timeout=0.5)]
    assert len(keys) == 6
    said = [r.getMessage() for r in caplog.records if r.name == "fastfeed.loading.dali.wait"]
    assert re.match(r"DALI pipeline stalled: no batch for \d+ s \(epoch 0, batch 2; pipeline 1 of 1\); "
                    r"the pipeline has not returned its output", said[0]), said
    assert "Workers(on_stall='raise') makes this an error" in said[0]
    assert re.match(r"DALI pipeline stall over: a batch came after \d+ s", said[-1]) and len(said) == 2


def test_on_stall_raise_abandons_the_pipeline_and_the_next_pass_builds_new_ones(packed: Path, hang: Hang) -> None:
    dl = _loader(packed, stall_timeout=0.5, on_stall="raise")
    it = iter(dl)
    assert len([next(it), next(it)]) == 2
    t0 = time.monotonic()
    with pytest.raises(StallError, match=r"DALI pipeline stalled: no batch for \d+ s \(epoch 0, batch 2; pipeline 1 "
                                         r"of 1\).* the pipeline is abandoned, the next batch builds new ones"):
        next(it)
    assert time.monotonic() - t0 < 0.5 + 2
    dl.set_epoch(0)
    assert len(list(dl)) == 6 and len(hang.built) == 2  # a new pipeline; the stuck one kept, never destroyed
    assert dali_pipeline._ABANDONED and dali_pipeline._ABANDONED[-1][0][0] is hang.built[0]
