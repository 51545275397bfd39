"""The peers the benchmarks compare fastfeed with, each built its documented, idiomatic way.

Loaders: every builder takes the same :class:`Setup` (batch size, output size, worker count,
prefetch) and the benchmark's data (``{"folder": ..., "fastfeed": ..., "wds": ..., "ffcv": ...}``)
and returns a :class:`Built`: ``epoch()`` starts one pass, ``close()`` stops its workers,
``what`` says exactly which pipeline ran (printed in the report), ``files`` are the bytes it
reads (what the page-cache helpers evict or warm). The pipeline is the same everywhere:
decode -> RandomResizedCrop(224, scale 0.08-1, ratio 3/4-4/3) -> random horizontal flip ->
one uint8 ``B x 3 x 224 x 224`` batch.

=====================  ===========================================================
name                   pipeline
=====================  ===========================================================
fastfeed               ``fastfeed.loader`` over ``fastfeed pack`` tar shards (its
                       defaults: restart markers where ``fastfeed._jpegroi`` is built)
fastfeed-nocompiler    ``fastfeed pack --no-jpeg-restarts`` shards (what pack writes
                       without ``fastfeed._jpegroi``), the extension hidden: an install
                       without a C compiler or libjpeg-turbo headers
fastfeed-noext         default shards, ``fastfeed._jpegroi`` hidden (restart cut in Python)
fastfeed-pillow        default shards, simplejpeg and OpenCV hidden (Pillow decode)
imagefolder            torchvision ``ImageFolder`` (PIL decode, its default) +
                       ``transforms.RandomResizedCrop/RandomHorizontalFlip/PILToTensor``
                       + ``DataLoader(shuffle=True)``: the PyTorch ImageNet example
imagefolder-tvio       ``ImageFolder(loader=torchvision.io.decode_image)`` (libjpeg-turbo
                       to a uint8 tensor) + ``transforms.v2`` on tensors
webdataset             ``wds.WebDataset(the same tar shards).shuffle(1000).decode("pil")
                       .to_tuple("jpg", "cls").map_tuple(...).batched(B)`` +
                       ``wds.WebLoader(batch_size=None)``: its documented recipe
ffcv                   ``ffcv.Loader`` over a ``.beton`` written from the same images
                       (``RGBImageField(write_mode="jpg", jpeg_quality=90)``, no resize),
                       ``RandomResizedCropRGBImageDecoder`` + ``RandomHorizontalFlip`` +
                       ``ToTensor`` + ``ToTorchImage``, ``order=RANDOM``, ``os_cache=True``
=====================  ===========================================================

Torch DataLoaders (ImageFolder, WebLoader) get ``persistent_workers=True`` like fastfeed's
default; FFCV's ``num_workers`` are its decoding threads and its prefetch is its default
``batches_ahead=3``.

Packers (``benchmarks/pack.py``): :data:`PACKERS` writes ~256 MB shards of the same files,
``webdataset.ShardWriter`` the way its documentation does (one process, ``{"__key__", "jpg",
"cls"}``), ``litdata.optimize`` with a function returning ``{"jpg": bytes, "cls": int}``.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from fastfeed.host import cpu_count

from benchmarks.lib.loaders import epochs, fastfeed_loader, shutdown
from benchmarks.lib.measure import Stopwatch
from benchmarks.lib.report import log

__all__ = ["BUILDERS", "PACKERS", "Built", "Setup", "list_imagefolder", "samples_per_shard", "write_beton"]


@dataclass(frozen=True)
class Setup:
    """What every loader gets."""

    workers: int
    batch_size: int = 256
    image_size: int = 224
    prefetch: int = 2
    seed: int = 0
    pin_memory: bool = False  # page-locked batches (torch DataLoaders), for a copy to the GPU


@dataclass
class Built:
    """A loader ready to run: ``epoch()`` starts a pass; ``close()`` ends its workers."""

    name: str
    what: str
    files: list[Path]
    epoch: Callable[[], Iterator[Any]]
    close: Callable[[], None] = lambda: None
    extra: dict[str, Any] = field(default_factory=dict)


def samples_per_shard(num_images: int, workers: int) -> int:
    """Samples per shard giving at least 8 shards and 2 per worker (WebDataset splits by shard)."""
    return max(1, math.ceil(num_images / max(8, 2 * workers)))


# ---------------------------------------------------------------------- fastfeed
def fastfeed_built(data: dict[str, Path], s: Setup, shards: str = "fastfeed", *, shuffle: bool | None = True) -> Built:
    """``fastfeed.loader`` over ``data[shards]``, at the setup's workers and prefetch."""
    from fastfeed.decode.image import decode_path

    ff = data[shards]
    dl = fastfeed_loader(ff, batch_size=s.batch_size, image_size=s.image_size, workers=s.workers,
                         prefetch=s.prefetch, shuffle=shuffle, seed=s.seed, pin_memory=False)
    options = json.loads((ff / "index.json").read_text()).get("options", {})
    if options.get("store") == "raw":
        what = "fastfeed.loader over `fastfeed pack --store raw` tar shards (crop + resize from stored pixels)"
    else:
        packed = "restart markers" if options.get("jpeg_restarts") else "plain JPEGs"
        what = f"fastfeed.loader over `fastfeed pack` tar shards ({packed}); {decode_path().message}"
    return Built("fastfeed", what, [ff], epochs(dl), lambda: shutdown(dl))


# ---------------------------------------------------------------------- torchvision
def _torch_loader(ds: Any, s: Setup, **kw: Any) -> Any:
    from torch.utils.data import DataLoader

    extra: dict[str, Any] = {}
    if s.workers:
        extra = {"prefetch_factor": s.prefetch, "persistent_workers": True}
    return DataLoader(ds, batch_size=s.batch_size, num_workers=s.workers, pin_memory=s.pin_memory, **extra, **kw)


def imagefolder_pil(data: dict[str, Path], s: Setup) -> Built:
    """torchvision ImageFolder, PIL decode (its default loader)."""
    from torchvision import datasets
    from torchvision import transforms as T

    tf = T.Compose([T.RandomResizedCrop(s.image_size), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = datasets.ImageFolder(str(data["folder"]), transform=tf)
    dl = _torch_loader(ds, s, shuffle=True)
    return Built("imagefolder", "torchvision ImageFolder, PIL decode (default loader), "
                 "transforms RandomResizedCrop+Flip+PILToTensor, DataLoader",
                 [data["folder"]], lambda: iter(dl), lambda: shutdown(dl), extra={"loader": dl})


def _decode_image(path: str) -> Any:
    from torchvision.io import ImageReadMode, decode_image

    return decode_image(path, mode=ImageReadMode.RGB)


def imagefolder_tvio(data: dict[str, Path], s: Setup) -> Built:
    """torchvision ImageFolder with ``torchvision.io.decode_image`` and ``transforms.v2``."""
    from torchvision import datasets
    from torchvision.transforms import v2

    tf = v2.Compose([v2.RandomResizedCrop(s.image_size, antialias=True), v2.RandomHorizontalFlip()])
    ds = datasets.ImageFolder(str(data["folder"]), loader=_decode_image, transform=tf)
    dl = _torch_loader(ds, s, shuffle=True)
    return Built("imagefolder-tvio", "torchvision ImageFolder, torchvision.io.decode_image "
                 "(libjpeg-turbo), transforms.v2 on uint8 tensors, DataLoader",
                 [data["folder"]], lambda: iter(dl), lambda: shutdown(dl))


# ---------------------------------------------------------------------- webdataset
def _label(x: Any) -> int:
    return int(x)


def webdataset_loader(data: dict[str, Path], s: Setup) -> Built:
    """WebDataset's documented recipe over the same tar shards."""
    import webdataset as wds
    from torchvision import transforms as T

    urls = sorted(str(p) for p in data["wds"].glob("*.tar"))
    tf = T.Compose([T.RandomResizedCrop(s.image_size), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = (
        wds.WebDataset(urls, shardshuffle=len(urls), seed=s.seed, empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(tf, _label)
        .batched(s.batch_size)
    )
    extra: dict[str, Any] = {}
    if s.workers:
        extra = {"prefetch_factor": s.prefetch, "persistent_workers": True}
    dl = wds.WebLoader(ds, batch_size=None, num_workers=s.workers, **extra)
    inner = dl.pipeline[0]
    return Built("webdataset", f"webdataset WebDataset over the same {len(urls)} tar shards, "
                 "shuffle(1000), decode('pil'), torchvision transforms, batched, WebLoader",
                 [Path(u) for u in urls], lambda: iter(dl), lambda: shutdown(inner))


# ---------------------------------------------------------------------- ffcv
def write_beton(folder: Path, *, quality: int = 90, raw_max_side: int | None = None) -> Path:
    """An FFCV ``.beton`` of the ImageFolder ``folder``, beside it; written once.

    FFCV stores images it encodes itself (``RGBImageField`` decodes and re-encodes), so the
    bytes are not the originals: JPEG at the same quality, same size (no ``max_resolution``),
    which keeps decode cost comparable; with ``raw_max_side``, raw pixels
    (``write_mode="raw"``, ``max_resolution``).
    """
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from torchvision import datasets

    if raw_max_side is None:
        dst = folder.with_name(f"{folder.name}.ffcv-jpg{quality}.beton")
        recipe: dict[str, Any] = {"src": str(folder), "quality": quality, "write_mode": "jpg"}
        field_ = RGBImageField(write_mode="jpg", jpeg_quality=quality)
    else:
        dst = folder.with_name(f"{folder.name}.ffcv-raw-{raw_max_side}.beton")
        recipe = {"src": str(folder), "write_mode": "raw", "max_resolution": raw_max_side}
        field_ = RGBImageField(write_mode="raw", max_resolution=raw_max_side)
    stamp = dst.with_name(dst.name + ".json")
    if dst.exists() and stamp.exists() and json.loads(stamp.read_text()) == recipe:
        return dst
    tmp = dst.with_name(dst.name + ".tmp")
    with Stopwatch() as took:
        writer = DatasetWriter(str(tmp), {"image": field_, "label": IntField()}, num_workers=cpu_count())
        writer.from_indexed_dataset(datasets.ImageFolder(str(folder)))
        shutil.move(tmp, dst)
    stamp.write_text(json.dumps(recipe))
    log(f"wrote {dst.name} in {took.wall:.0f} s")
    return dst


def ffcv_loader(data: dict[str, Path], s: Setup) -> Built:
    """``ffcv.Loader`` over ``data["ffcv"]`` with its RandomResizedCrop decoder and flip."""
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    beton = data["ffcv"]
    loader = Loader(
        str(beton), batch_size=s.batch_size, num_workers=max(1, s.workers),
        order=OrderOption.RANDOM, os_cache=True, drop_last=True, seed=s.seed,
        pipelines={
            "image": [RandomResizedCropRGBImageDecoder((s.image_size, s.image_size)),
                      RandomHorizontalFlip(), ToTensor(), ToTorchImage()],
            "label": [IntDecoder(), ToTensor(), Squeeze()],
        },
    )
    stored = "raw pixels, RGBImageField(write_mode='raw', max_resolution)" if ".ffcv-raw-" in beton.name \
        else "JPEG q90 re-encoded by FFCV"
    return Built("ffcv", f"ffcv.Loader over a .beton ({stored}), "
                 f"{max(1, s.workers)} decode threads, RandomResizedCrop+Flip, os_cache",
                 [beton], lambda: iter(loader))


#: name -> (builder, data key it needs)
BUILDERS: dict[str, tuple[Callable[[dict[str, Path], Setup], Built], str]] = {
    "fastfeed": (fastfeed_built, "fastfeed"),
    # the same loader with a library hidden from it (issue 17's fallbacks; the child process
    # blocks the import, see loader_cpu.HIDDEN): no compiler at install (pack then writes
    # plain JPEGs, the same shards WebDataset reads), default shards loaded without the
    # extension, and no simplejpeg/OpenCV
    "fastfeed-nocompiler": (lambda data, s: fastfeed_built(data, s, "wds"), "wds"),
    "fastfeed-noext": (fastfeed_built, "fastfeed"),
    "fastfeed-pillow": (fastfeed_built, "fastfeed"),
    "imagefolder": (imagefolder_pil, "folder"),
    "imagefolder-tvio": (imagefolder_tvio, "folder"),
    "webdataset": (webdataset_loader, "wds"),
    "ffcv": (ffcv_loader, "ffcv"),
}


# ---------------------------------------------------------------------- packers
SHARD_BYTES = 256_000_000


def list_imagefolder(src: Path) -> list[tuple[str, int, str]]:
    """(path, class index, key) for every image, classes and files sorted, then shuffled (seed 0)."""
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    items = []
    for c, name in enumerate(classes):
        for f in sorted((src / name).iterdir()):
            items.append((str(f), c, f"{name}/{f.stem}"))
    random.Random(0).shuffle(items)
    return items


def pack_fastfeed(src: Path, out: Path, items: list[tuple[str, int, str]], workers: int) -> int:
    """``fastfeed.pack`` with its defaults and ~256 MB shards; the samples written."""
    import fastfeed

    return fastfeed.pack(src, out, workers=workers, shard_size=SHARD_BYTES).num_samples


def pack_webdataset(src: Path, out: Path, items: list[tuple[str, int, str]], workers: int) -> int:
    """``webdataset.ShardWriter``: one process reads each file and writes it to the shard."""
    import webdataset as wds

    out.mkdir(parents=True)
    n = 0
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=SHARD_BYTES, maxcount=10**9, verbose=0) as sink:
        for path, cls, key in items:
            with open(path, "rb") as f:
                sink.write({"__key__": key, "jpg": f.read(), "cls": cls})
            n += 1
    return n


def _litdata_item(item: tuple[str, int, str]) -> dict[str, Any]:
    path, cls, _ = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": cls}


def pack_litdata(src: Path, out: Path, items: list[tuple[str, int, str]], workers: int) -> int:
    """``litdata.optimize`` over the same files, ``workers`` processes."""
    from litdata import optimize

    optimize(fn=_litdata_item, inputs=items, output_dir=str(out), chunk_bytes=SHARD_BYTES,
             num_workers=workers, verbose=False, mode="overwrite")
    return len(items)


#: tool name -> (packer, workers, module it needs)
PACKERS: dict[str, tuple[Callable[[Path, Path, list[tuple[str, int, str]], int], int], int, str]] = {
    "fastfeed 1 worker": (pack_fastfeed, 1, "fastfeed"),
    "fastfeed 2 workers": (pack_fastfeed, 2, "fastfeed"),
    "webdataset.ShardWriter": (pack_webdataset, 1, "webdataset"),
    "litdata.optimize 2 workers": (pack_litdata, 2, "litdata"),
}
