"""``fastfeed balance``: padding and rank balance of the length-aware samplers vs DistributedSampler, or,
with ``--resolution``, the aspect-ratio buckets, their crop and pixel balance vs naive per-rank bucketing.

Prints the :class:`~fastfeed.sampling.balance.BalanceReport` or, with ``--resolution``, the
:class:`~fastfeed.sampling.aspect_report.AspectBalanceReport` (JSON with ``--json``).

Example:
    >>> from fastfeed.cli import main
    >>> main(["balance", "/data/wiki-ff", "--world-size", "8", "--max-cost", "16384"])  # doctest: +SKIP
    0
    >>> main(["balance", "/data/photos-ff", "--resolution", "1024", "--max-pixels", "8388608"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import json
import logging
import re

from fastfeed.cli.args import add_json
from fastfeed.cli.command import EXIT_OK, Command
from fastfeed.errors import ConfigError

__all__ = ["COMMAND", "add", "run"]

#: the world size of ``--resolution`` when ``--world-size`` is not given
ASPECT_WORLD_SIZE = 8
#: the batch of ``--resolution`` when neither ``--batch-size`` nor ``--max-pixels`` is given
ASPECT_BATCH_SIZE = 8


def add(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fastfeed balance``."""
    p.add_argument("dst", metavar="DST", help="a packed dataset with lengths (pack --length), or a .npy of lengths; "
                   "with --resolution, a packed dataset of images (sizes.npy) or a .npy of (height, width)")
    p.add_argument("--world-size", type=int, default=None, metavar="W",
                   help=f"number of ranks (required for lengths; default {ASPECT_WORLD_SIZE} with --resolution)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--batch-size", type=int, metavar="B", help="fixed batches of B (length or aspect buckets)")
    mode.add_argument("--max-cost", metavar="C",
                      help="a cost budget per batch (tokens, or seconds such as 0.12 / 120ms with --model)")
    mode.add_argument("--max-pixels", type=int, metavar="P",
                      help="with --resolution: a pixel budget per batch, e.g. 8388608 (8 images of 1024x1024)")
    p.add_argument("--cost", default="tokens", choices=["tokens", "attention", "varlen"],
                   help="built-in cost: padded tokens, + padded attention, or packed/varlen (default tokens)")
    p.add_argument("--model", metavar="JSON", help="a fitted cost model (fastfeed.calibrate); costs in seconds")
    aspect = p.add_argument_group("aspect-ratio buckets (images)")
    aspect.add_argument("--resolution", type=int, default=None, metavar="R",
                        help="report aspect-ratio buckets of about R x R pixels (DistributedAspectRatioSampler) "
                        f"against naive per-rank bucketing; default batch {ASPECT_BATCH_SIZE}")
    aspect.add_argument("--buckets", metavar="HxW,...", default=None,
                        help="the buckets instead of the generated ones, e.g. 1024x1024,832x1216,1216x832")
    aspect.add_argument("--max-upscale", type=_upscale, default=2.0, metavar="X",
                        help="images to enlarge more than X to cover their bucket are left out, counted "
                        "(default 2; none: no limit)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--epoch", type=int, default=0, help="which epoch to plan (default 0)")
    p.add_argument("--drop-last", action="store_true", help="drop the remainder instead of repeating")
    p.add_argument("--baseline-batch-size", type=int, default=None, metavar="B",
                   help="the baseline's batch size (default: the same real tokens, or pixels, per batch)")
    add_json(p, "report")


def _max_cost(text: str | None) -> float | str | None:
    """A number of cost units, or the text of a duration (``120ms``), which the sampler checks against the model."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _upscale(text: str) -> float | None:
    """``--max-upscale 2`` or ``none``."""
    if text.strip().lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (or none)") from None


def parse_buckets(text: str | None) -> list[tuple[int, int]] | None:
    """``--buckets 1024x1024,832x1216``: (height, width) pairs.

    Example:
        >>> parse_buckets("1024x1024, 832x1216")
        [(1024, 1024), (832, 1216)]
    """
    if text is None:
        return None
    out = []
    for part in (t.strip() for t in text.split(",")):
        m = re.fullmatch(r"(\d+)\s*[xX*]\s*(\d+)", part)
        if not m:
            raise ConfigError(f"--buckets {text!r}: {part!r} is not HEIGHTxWIDTH; give e.g. "
                              "--buckets 1024x1024,832x1216,1216x832")
        out.append((int(m.group(1)), int(m.group(2))))
    return out


def _run_aspect(args: argparse.Namespace) -> int:
    from fastfeed.sampling.aspect_report import aspect_balance_report

    refused = [f for f, given in (("--max-cost", args.max_cost is not None), ("--model", args.model),
                                  ("--cost", args.cost != "tokens"), ("--drop-last", args.drop_last)) if given]
    if refused:
        raise ConfigError(f"{', '.join(refused)}: for the length samplers; with --resolution give --batch-size B or "
                          "--max-pixels P")
    sampler_log = logging.getLogger("fastfeed.sampling.aspect")
    level = sampler_log.level
    sampler_log.setLevel(logging.ERROR)  # the report counts the images the sampler leaves out: said once
    try:
        report = aspect_balance_report(
            args.dst, resolution=args.resolution,
            world_size=ASPECT_WORLD_SIZE if args.world_size is None else args.world_size,
            batch_size=args.batch_size, max_pixels=args.max_pixels, buckets=parse_buckets(args.buckets),
            max_upscale=args.max_upscale, seed=args.seed,
            epoch=args.epoch, baseline_batch_size=args.baseline_batch_size)
    finally:
        sampler_log.setLevel(level)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.text())
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """``fastfeed balance``: :func:`fastfeed.balance_report` (or, with ``--resolution``,
    :func:`~fastfeed.sampling.aspect_report.aspect_balance_report`) over one epoch."""
    if args.resolution is not None:
        return _run_aspect(args)
    from fastfeed.sampling.balance import balance_report

    if args.world_size is None:
        raise ConfigError("--world-size W is required (the ranks to plan for); or pass --resolution R for "
                          "aspect-ratio buckets of images")
    if args.max_pixels is not None or args.buckets is not None:
        raise ConfigError("--max-pixels and --buckets are for aspect-ratio buckets: add --resolution R (e.g. 1024)")
    if args.batch_size is None and args.max_cost is None:
        raise ConfigError("give --batch-size B (fixed batches) or --max-cost C (a cost budget per batch)")
    report = balance_report(args.dst, world_size=args.world_size, batch_size=args.batch_size,
                            max_cost=_max_cost(args.max_cost), cost=args.model if args.model else args.cost,
                            seed=args.seed, epoch=args.epoch, drop_last=args.drop_last,
                            baseline_batch_size=args.baseline_batch_size)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.text())
    return EXIT_OK


COMMAND = Command("balance", "compare padding and rank balance of fastfeed's length-aware samplers with "
                  "DistributedSampler + a fixed batch, or (--resolution) the aspect-ratio buckets' crop and pixel "
                  "balance with naive per-rank bucketing, over one epoch", add, run)
