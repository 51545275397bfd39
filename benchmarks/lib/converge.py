"""The autotune convergence run of ``train_step``: its bad start, and its table.

- :func:`bad_start`: a folder holding a stored tune record of a few workers (prefetch factor 2)
  for a dataset and loader shape, which ``fastfeed.loader(num_workers="auto")`` starts from once
  ``FASTFEED_TUNE_DIR`` names it (as a tune of another job, or another host's load, would leave);
- :func:`print_converge`: a row per epoch (img/s, data wait, the setting), the epoch from which
  the goal holds, and the changes the loader's autotune logged.

Example:
    >>> goal_epoch([{"epoch": 0, "data_share_after_first": 0.3}, {"epoch": 1, "data_share_after_first": 0.01}], 0.02)
    1
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from benchmarks.lib.report import fmt_rate, pct

__all__ = ["bad_start", "goal_epoch", "print_converge"]


def bad_start(packed: Path, store: Path, *, batch: int, image: int, workers: int) -> Path:
    """``store`` (emptied first) holding a tune record of ``workers`` workers, prefetch factor 2."""
    from fastfeed.dist import local_world_size
    from fastfeed.knobs.record import TuneKey, TuneRecord, save_record
    from fastfeed.packed.index import DatasetIndex

    index = DatasetIndex.load(packed)
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    key = TuneKey.current(index.fingerprint, batch_size=batch, decode="cpu", image_size=image,
                          local_world_size=local_world_size())
    save_record(TuneRecord(key, workers, 2, details={"reason": "train_step's bad start for autotune"}),
                str(packed), store_dir=store)
    return store


def goal_epoch(rows: list[dict[str, Any]], goal: float) -> int | None:
    """The first epoch from which every epoch's data wait (after its first step) is at most ``goal``."""
    for i in range(len(rows)):
        if all((r["data_share_after_first"] or 0.0) <= goal for r in rows[i:]):
            return rows[i]["epoch"]
    return None


def print_converge(title: str, rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each convergence row (its grid point, its figures) as a table; the rows with the goal's epoch."""
    from fastfeed.loading.autotune import GOAL

    out = []
    for pt, r in rows:
        print(f"\n== {title}: autotune convergence (round {pt['round']})")
        print(f"  {r['what']}")
        print(f"{'epoch':>6}{'steps':>7}{'img/s':>9}{'data wait':>11}{'after 1st':>11}{'1st wait s':>12}  setting "
              "(workers x prefetch: at the 1st batch -> at the end)")
        for e in r["epochs"]:
            a, b = e["at_start"], e["at_end"]
            print(f"{e['epoch']:>6}{e['steps']:>7}{fmt_rate(e['img_s']):>9}{pct(e['data_share']):>11}"
                  f"{pct(e['data_share_after_first']):>11}{e['first_wait_s']:>12.2f}  "
                  f"{a['num_workers']}x{a['prefetch_factor']} -> {b['num_workers']}x{b['prefetch_factor']}")
        at = goal_epoch(r["epochs"], GOAL)
        print(f"  goal (at most {GOAL:.0%} waiting after each epoch's first step): "
              + (f"met from epoch {at} on" if at is not None else "not met in these epochs"))
        for c in r["changes"]:
            print(f"    change: {c}")
        if r.get("at_limit"):
            print(f"    then: {r['at_limit']}")
        out.append({"round": pt["round"], "goal_from_epoch": at, **r})
    return out
