"""fastfeed.loading.compat without any framework: the re-created loader is the same loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from _loader_data import keys_of, write_dataset

import fastfeed
from fastfeed.loading.compat import recreate_kwargs


@pytest.mark.parametrize("workers", [0, 2])
def test_recreated_loader_yields_the_same_batches(tmp_path: Path, workers: int) -> None:
    write_dataset(tmp_path, shard_counts=(7, 7, 7, 4))
    dl = fastfeed.loader(tmp_path, batch_size=3, seed=4, decode=None, num_workers=workers, rank=1, world_size=2,
                         log_every=5)
    twin = type(dl)(**recreate_kwargs(dl))
    assert type(twin) is type(dl) and twin.dataset is dl.dataset and twin.stats is not dl.stats
    assert (twin.rank, twin.world_size, len(twin), twin.num_workers) == (1, 2, len(dl), workers)
    assert twin.stats.log_every == 5 and twin.workers_from == dl.workers_from
    first = keys_of(dl)
    assert keys_of(twin) == first  # epoch 0 from its start, as the original's first pass
    assert keys_of(dl) != first  # the original goes on to epoch 1
    assert twin.stats.steps == len(dl) and dl.stats.steps == 2 * len(dl)


def test_loader_tells_frameworks_what_they_need(tmp_path: Path) -> None:
    write_dataset(tmp_path, shard_counts=(4,))
    dl = fastfeed.loader(tmp_path, batch_size=2, decode=None, num_workers=0)
    assert dl._is_accelerate_prepared is True  # Accelerate's prepare returns it as is
    saved = getattr(dl, "__pl_saved_kwargs")  # what Lightning re-creates it from
    assert saved["dataset"] is dl.dataset and getattr(dl, "__pl_saved_args") == ()
    assert getattr(dl, "__dataset") is dl.dataset
    with pytest.raises(ValueError, match="sampler"):
        type(dl)(**{**recreate_kwargs(dl), "sampler": [0, 1]})
