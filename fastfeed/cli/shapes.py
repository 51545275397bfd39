"""``fastfeed shapes``: record every image's displayed size in a dataset packed without them.

Prints the :class:`~fastfeed.packing.shapes.ShapesResult` (JSON with ``--json``). ``pack``
records the sizes itself; this is for datasets packed before it did, so that the
aspect-ratio sampler (:class:`~fastfeed.sampling.aspect.DistributedAspectRatioSampler`) and
``fastfeed info``'s aspect-ratio lines work without a re-pack.

Example:
    >>> from fastfeed.cli import main
    >>> main(["shapes", "/data/photos-ff"])   # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import json

from fastfeed._progress import Progress
from fastfeed.cli.args import add_json, auto_int
from fastfeed.cli.command import EXIT_OK, Command

__all__ = ["COMMAND", "add", "run"]


def add(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fastfeed shapes``."""
    p.add_argument("dst", metavar="DST", help="a local packed dataset folder")
    p.add_argument("--overwrite", action="store_true", help="read the sizes again when the index already has them")
    p.add_argument("--workers", default="1", metavar="N", help="processes reading shards (default 1; auto: one "
                   "per core)")
    add_json(p, "result")


def run(args: argparse.Namespace) -> int:
    """``fastfeed shapes``: :func:`fastfeed.packing.shapes.add_shapes` on DST."""
    from fastfeed.host import cpu_count
    from fastfeed.packing.shapes import add_shapes

    workers = auto_int(args.workers, "--workers")
    bar = Progress("shapes", "shard")
    try:
        result = add_shapes(args.dst, overwrite=args.overwrite,
                            workers=cpu_count() if workers == "auto" else max(1, int(workers)), progress=bar.update)
    finally:
        bar.close()
    print(json.dumps(result.to_json(), indent=1) if args.json else result.text())
    return EXIT_OK


COMMAND = Command("shapes", "record every image's displayed size (height, width) in a packed dataset's index, "
                  "without re-packing (what the aspect-ratio sampler buckets by)", add, run)
