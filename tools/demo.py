"""``python -m tools.demo --root demo-data``: fastfeed end to end on generated data.

``make demo`` runs this. Each step is a function taking the :class:`Demo` state, listed
in :data:`STEPS` and run in order by :func:`main`; later features add their steps (tune,
one epoch of loading) by appending to :data:`STEPS`. Re-running is cheap: the images are
reused when they match the request, and packing an already packed dataset is a no-op.

Steps:

1. :func:`make_data`: an ImageNet-like folder of photo-like JPEGs (``tools.synth``),
   ``ROOT/train/<class>/<image>.jpg``;
2. :func:`pack_data`: ``fastfeed pack ROOT/train ROOT/train-ff`` (the CLI, with its
   progress bar on a terminal);
3. :func:`show_info`: ``fastfeed info ROOT/train-ff``;
4. :func:`tune_loader`: ``fastfeed tune ROOT/train-ff`` (stored for ``num_workers="auto"``);
5. :func:`load_epoch`: one epoch through ``fastfeed.loader`` with the tuned setting, and its
   throughput.

The commands it prints run as printed from the same folder: they name the ``fastfeed``
script of the environment that runs the demo (``.venv/bin/fastfeed`` after ``make demo``), and
the last lines say how to activate that environment.

Example:
    $ python -m tools.demo --root demo-data --images 2000
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from fastfeed.host import cpu_count

__all__ = ["STEPS", "Demo", "fastfeed_command", "load_epoch", "main", "make_data", "pack_data", "show_info", "tune_loader"]


@dataclass
class Demo:
    """State shared by the demo steps.

    Attributes:
        root: the demo folder.
        images: number of generated images.
        classes: number of classes.
        workers: processes for packing (and later loading).
        src: the ImageFolder (``root/train``).
        dst: the packed dataset (``root/train-ff``).
        index: the packed dataset's index, once packed.
        notes: anything a step wants to hand to later steps.
    """

    root: Path
    images: int = 2000
    classes: int = 20
    workers: int | str = "auto"
    index: Any = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def src(self) -> Path:
        return self.root / "train"

    @property
    def dst(self) -> Path:
        return self.root / "train-ff"


def fastfeed_command() -> str:
    """How to run the ``fastfeed`` CLI of this Python, as a user types it from the current folder.

    The environment's own script (``.venv/bin/fastfeed``, relative when it lies below the
    current folder) when it exists, else ``python -m fastfeed`` with this interpreter.
    """
    script = Path(sys.executable).parent / "fastfeed"
    if not script.is_file():
        return f"{shlex.quote(_shown(Path(sys.executable)))} -m fastfeed"
    return shlex.quote(_shown(script))


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
    except ValueError:  # another drive (Windows)
        return str(path)


def _say(args: Sequence[str]) -> None:
    print("$ " + " ".join([fastfeed_command(), *map(shlex.quote, args)]), flush=True)


def make_data(demo: Demo) -> None:
    """Generate the ImageNet-like folder (reused when it already matches)."""
    from tools.synth import make_image_folder

    recipe = {"images": demo.images, "classes": demo.classes, "size": [500, 375], "vary_size": True}
    stamp = demo.root / "train.recipe.json"
    if demo.src.is_dir() and stamp.is_file() and json.loads(stamp.read_text()) == recipe:
        print(f"using {demo.images} images in {demo.src}")
        return
    workers = cpu_count() if demo.workers == "auto" else int(demo.workers)
    stamp.unlink(missing_ok=True)
    make_image_folder(demo.src, num_images=demo.images, num_classes=demo.classes, size=(500, 375),
                      vary_size=True, workers=workers)
    stamp.write_text(json.dumps(recipe))
    total = sum(p.stat().st_size for p in demo.src.rglob("*.jpg"))
    print(f"generated {demo.images} JPEGs ({total / 1e6:.0f} MB, {demo.classes} classes) in {demo.src}")


def pack_data(demo: Demo) -> None:
    """``fastfeed pack`` the folder into ~32 MB tar shards (several, to show sharding)."""
    from fastfeed.cli import main as cli
    from fastfeed.packed.index import DatasetIndex

    args = ["pack", str(demo.src), str(demo.dst), "--shard-size", "32MB", "--workers", str(demo.workers)]
    _say(args)
    rc = cli(args)
    if rc != 0:
        raise SystemExit(rc)
    demo.index = DatasetIndex.load(demo.dst)


def show_info(demo: Demo) -> None:
    """``fastfeed info`` of the packed dataset."""
    from fastfeed.cli import main as cli

    _say(["info", str(demo.dst)])
    cli(["info", str(demo.dst)])


def tune_loader(demo: Demo) -> None:
    """``fastfeed tune``: measure num_workers / prefetch_factor for the loading step.

    The loading step uses ``demo.notes["batch_size"]`` and ``["image_size"]`` with
    ``num_workers="auto"``, so it picks up this result (tune results are keyed by them).
    """
    from fastfeed.cli import main as cli

    demo.notes.setdefault("batch_size", 64)
    demo.notes.setdefault("image_size", 224)
    args = [str(demo.dst), "--batch-size", str(demo.notes["batch_size"]), "--image-size",
            str(demo.notes["image_size"]), "--time-budget", "30s"]
    _say(["tune", *args])
    rc = cli(["tune", *args])
    if rc != 0:
        raise SystemExit(rc)


def load_epoch(demo: Demo) -> None:
    """One epoch through ``fastfeed.loader`` with the tuned settings; prints throughput.

    Also shows a batch's structure and the loader's own ``stats`` (time the loop waited
    for data), the figures a training script would log.
    """
    import fastfeed

    bs, size = demo.notes.get("batch_size", 64), demo.notes.get("image_size", 224)
    dl = fastfeed.loader(demo.dst, batch_size=bs, image_size=size, num_workers="auto",
                         workers=fastfeed.Workers(prefetch_factor="auto"), seed=0)
    dl.set_epoch(0)
    print(f">>> fastfeed.loader({str(demo.dst)!r}, batch_size={bs}, image_size={size})"
          f"  # -> {len(dl)} batches, num_workers={dl.num_workers}")
    t0 = time.perf_counter()
    n = 0
    first: dict[str, Any] | None = None
    for batch in dl:
        if first is None:
            first = {k: (tuple(v.shape), str(v.dtype)) if hasattr(v, "shape") else type(v).__name__
                     for k, v in batch.items()}
        n += len(batch["__key__"])
    elapsed = time.perf_counter() - t0
    print(f"   batch: {first}")
    print(f"   one epoch: {n} images in {elapsed:.1f} s = {n / elapsed:,.0f} img/s "
          f"(start-up included; decode -> RandomResizedCrop {size} -> flip -> uint8 NCHW)")
    summary = dl.stats.summary()
    print(f"   loader.stats: waited {summary.get('wait_fraction', 0.0):.0%} of the loop for data, "
          f"{summary.get('samples_per_s', 0.0):,.0f} samples/s, skipped {summary.get('skipped', 0)}")


#: The demo, in order: (title, step). Append to add a step.
STEPS: list[tuple[str, Callable[[Demo], None]]] = [
    ("make an ImageNet-like dataset", make_data),
    ("pack it", pack_data),
    ("inspect it", show_info),
    ("tune the loader for this machine", tune_loader),
    ("load one epoch", load_epoch),
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run every step of :data:`STEPS`; returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="demo-data", help="demo folder (default demo-data)")
    ap.add_argument("--images", type=int, default=2000, help="images to generate (default 2000)")
    ap.add_argument("--classes", type=int, default=20, help="classes (default 20)")
    ap.add_argument("--workers", default="auto", help="processes (default auto: one per core)")
    args = ap.parse_args(argv)
    demo = Demo(Path(args.root), images=args.images, classes=args.classes, workers=args.workers)
    demo.root.mkdir(parents=True, exist_ok=True)
    for n, (title, step) in enumerate(STEPS, 1):
        print(f"\n== {n}. {title}", flush=True)
        t0 = time.perf_counter()
        step(demo)
        print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
    _next_steps(demo)
    return 0


def _next_steps(demo: Demo) -> None:
    """Print what to try next, runnable as printed from the current folder."""
    ff = fastfeed_command()
    bindir = Path(sys.executable).parent
    print("\n== next: the same tools on the packed demo data")
    if (bindir / "activate").is_file():
        print(f"   (these run as printed; or `source {shlex.quote(_shown(bindir / 'activate'))}`, then type `fastfeed ...`)")
    dst = shlex.quote(str(demo.dst))
    print(f"$ {ff} verify {dst}")
    print(f"$ {ff} doctor {dst} --batch-size 64 --image-size 224 --time-budget 30s")
    print(f"$ {ff} tune {dst} --batch-size 64 --image-size 224 --time-budget 30s --no-store")


if __name__ == "__main__":
    sys.exit(main())
