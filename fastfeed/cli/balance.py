"""``fastfeed balance``: padding and rank balance of the length-aware samplers vs DistributedSampler.

Prints the :class:`~fastfeed.sampling.balance.BalanceReport` (JSON with ``--json``).

Example:
    >>> from fastfeed.cli import main
    >>> main(["balance", "/data/wiki-ff", "--world-size", "8", "--max-cost", "16384"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import json

from fastfeed.cli.args import add_json
from fastfeed.cli.command import EXIT_OK, Command

__all__ = ["COMMAND", "add", "run"]


def add(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fastfeed balance``."""
    p.add_argument("dst", metavar="DST", help="a packed dataset with lengths (pack --length), or a .npy of lengths")
    p.add_argument("--world-size", type=int, required=True, metavar="W", help="number of ranks")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--batch-size", type=int, metavar="B", help="fixed batches of B (length buckets)")
    mode.add_argument("--max-cost", metavar="C",
                      help="a cost budget per batch (tokens, or seconds such as 0.12 / 120ms with --model)")
    p.add_argument("--cost", default="tokens", choices=["tokens", "attention", "varlen"],
                   help="built-in cost: padded tokens, + padded attention, or packed/varlen (default tokens)")
    p.add_argument("--model", metavar="JSON", help="a fitted cost model (fastfeed.calibrate); costs in seconds")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--epoch", type=int, default=0, help="which epoch to plan (default 0)")
    p.add_argument("--drop-last", action="store_true", help="drop the remainder instead of repeating")
    p.add_argument("--baseline-batch-size", type=int, default=None, metavar="B",
                   help="DistributedSampler's batch size (default: the same real tokens per batch)")
    add_json(p, "report")


def _max_cost(text: str | None) -> float | str | None:
    """A number of cost units, or the text of a duration (``120ms``), which the sampler checks against the model."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def run(args: argparse.Namespace) -> int:
    """``fastfeed balance``: :func:`fastfeed.balance_report` over one epoch."""
    from fastfeed.sampling.balance import balance_report

    report = balance_report(args.dst, world_size=args.world_size, batch_size=args.batch_size,
                            max_cost=_max_cost(args.max_cost), cost=args.model if args.model else args.cost,
                            seed=args.seed, epoch=args.epoch, drop_last=args.drop_last,
                            baseline_batch_size=args.baseline_batch_size)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.text())
    return EXIT_OK


COMMAND = Command("balance", "compare padding and rank balance of fastfeed's length-aware samplers with "
                  "DistributedSampler + a fixed batch, over one epoch", add, run)
