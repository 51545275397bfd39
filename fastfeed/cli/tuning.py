"""``fastfeed tune``: measure the loader and store the best ``num_workers`` / ``prefetch_factor``.

Prints the :class:`~fastfeed.tuning.report.TuneResult` (its table, then its summary; JSON with
``--json``); one line per measured setting on stderr as it goes.

Example:
    >>> from fastfeed.cli import main
    >>> main(["tune", "/data/imagenet-ff", "--batch-size", "256", "--step-time", "0.25"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from fastfeed.cli.args import add_demand, add_json, add_loader_flags, add_sizes, loader_args, resolve_sizes
from fastfeed.cli.command import EXIT_OK, Command

if TYPE_CHECKING:
    from fastfeed.tuning.search import Trial

__all__ = ["COMMAND", "add", "run"]

#: the loader options tune takes as flags (their flags: fastfeed.loading.options)
LOADER_SETTINGS = ("decode",)


def add(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fastfeed tune``."""
    p.add_argument("dst", metavar="DST", help="a packed dataset (folder or URL)")
    add_sizes(p)
    add_loader_flags(p, LOADER_SETTINGS)
    p.add_argument("--time-budget", default="60s", help="measuring time, e.g. 60s or 2m (default 60s)")
    p.add_argument("--max-workers", type=int, default=None,
                   help="cap on workers (default: twice the cores per rank)")
    add_demand(p, "what one rank's training consumes: pick the cheapest setting that feeds it")
    p.add_argument("--memory-budget", default=None,
                   help="main + worker memory a setting may use, e.g. 16GB (default: half the "
                        "memory / LOCAL_WORLD_SIZE)")
    p.add_argument("--trial-time", type=float, default=None, metavar="SECONDS",
                   help="seconds per measured setting (default: from the time budget)")
    p.add_argument("--plot", default=None, metavar="PNG", help="draw throughput against workers")
    p.add_argument("--store-dir", default=None,
                   help="store the result here (default: the dataset folder, else ~/.cache/fastfeed)")
    p.add_argument("--no-store", action="store_true", help="measure only; do not store the result")
    p.add_argument("--replace", action="store_true",
                   help="store the result even when the stored one is better (steady, confirmed or longer)")
    add_json(p, "result")


def _progress(t: Trial) -> None:
    """One line on stderr per measured setting."""
    m = t.measurement
    rate = f"{m.samples_per_s:,.0f} samples/s" if m is not None else t.status
    flag = "" if m is None or m.steady else f" (not steady: {m.note})"
    print(f"  {t.phase:<8} {t.setting.label}: {rate}{flag}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """``fastfeed tune``: :func:`fastfeed.tune`, then its result (warnings on stderr with ``--json``)."""
    from fastfeed.tuning.api import tune

    settings = loader_args(args, LOADER_SETTINGS)
    batch_size, image_size = resolve_sizes(args, settings["decode"])
    result = tune(
        args.dst, batch_size=batch_size, image_size=image_size, **settings,
        time_budget=args.time_budget, max_workers=args.max_workers, target_rate=args.target_rate,
        step_time=args.step_time, memory_budget=args.memory_budget, trial_time=args.trial_time,
        plot=args.plot, store=not args.no_store, store_dir=args.store_dir, replace_better=args.replace,
        on_trial=None if args.json else _progress,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
        for note in result.notes:
            print(f"warning: {note}", file=sys.stderr)
        return EXIT_OK
    print(f"{result.table()}\n\n{result.summary()}")  # TuneResult has no text() (yet): its two parts
    if args.plot:
        print(f"plot: {args.plot}")
    return EXIT_OK


COMMAND = Command("tune", "measure the loader and store the best num_workers / prefetch_factor for this host",
                  add, run)
