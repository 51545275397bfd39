"""``fastfeed doctor``: measure each stage of the input pipeline and name the one that limits training.

Prints the :class:`~fastfeed.diagnosis.report.DoctorReport` (JSON with ``--json``); one line per
measured stage on stderr as it goes. ``--fail-if-input-bound`` exits 1 on an input-bound verdict.

Example:
    >>> from fastfeed.cli import main
    >>> main(["doctor", "/data/imagenet-ff", "--step-time", "0.25", "--fail-if-input-bound"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import json
import sys

from fastfeed.cli.args import add_demand, add_json, add_loader_flags, add_sizes, loader_args, resolve_sizes
from fastfeed.cli.command import EXIT_OK, EXIT_PROBLEMS, Command
from fastfeed.errors import ConfigError

__all__ = ["COMMAND", "add", "run"]

#: the loader options doctor takes as flags (their flags: fastfeed.loading.options)
LOADER_SETTINGS = ("decode", "num_workers", "prefetch_factor", "cache_dir")


def add(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fastfeed doctor``."""
    p.add_argument("dst", metavar="DST", help="a packed dataset (folder or URL), or WebDataset tars")
    p.add_argument("--source", default=None, metavar="RAW_FOLDER",
                   help="the raw folder DST was packed from: also measure its small-file reads")
    add_demand(p, "what one rank's training consumes, in samples/s")
    p.add_argument("--world-size", type=int, default=None, metavar="W",
                   help="ranks, for the length balance (default: WORLD_SIZE, else 1)")
    add_sizes(p)
    add_loader_flags(p, LOADER_SETTINGS)
    p.add_argument("--time-budget", default="60s", help="total measuring time, e.g. 60s or 2m (default 60s)")
    add_json(p, "report")
    p.add_argument("--report", default=None, metavar="HTML", help="also write a self-contained HTML report")
    p.add_argument("--fail-if-input-bound", action="store_true",
                   help="exit 1 when the verdict is input-bound (needs --target-rate or --step-time), "
                        "so a CI job can gate on it")


def _progress(stage: object) -> None:
    """One line on stderr per measured stage."""
    print(f"  measured {getattr(stage, 'name', stage)}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """``fastfeed doctor``: :func:`fastfeed.doctor`, then its report; exit 1 for an input-bound
    verdict with ``--fail-if-input-bound``."""
    from fastfeed.diagnosis.api import doctor

    if args.fail_if_input_bound and args.target_rate is None and args.step_time is None:
        raise ConfigError("--fail-if-input-bound needs what training consumes: pass --target-rate SAMPLES_PER_S "
                          "or --step-time SECONDS (without a demand there is no input-bound verdict)")
    settings = loader_args(args, LOADER_SETTINGS)
    batch_size, image_size = resolve_sizes(args, settings["decode"], settings["cache_dir"])
    result = doctor(
        args.dst, source=args.source, target_rate=args.target_rate, step_time=args.step_time,
        world_size=args.world_size, batch_size=batch_size, image_size=image_size, **settings,
        time_budget=args.time_budget, report=args.report, on_stage=None if args.json else _progress,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(result.text())
        if args.report:
            print(f"report: {args.report}")
    if args.fail_if_input_bound and result.input_bound:
        print(f"fastfeed doctor: input-bound ({result.deliverable:,.0f} of {result.demand:,.0f} samples/s per "
              "rank): exit 1 (--fail-if-input-bound)", file=sys.stderr)
        return EXIT_PROBLEMS
    return EXIT_OK


COMMAND = Command("doctor", "measure storage, decode, the loader and rank balance on their own, and name the "
                  "stage that limits training, with the figures and the fix", add, run)
