"""Per-core speed of fastfeed's CPU decode path, against FFCV's per-image operations.

One process, one core, no worker processes: how many images per second of CPU time
does each pipeline turn into a uint8 batch of ``--batch`` 224x224 RandomResizedCrops
with random horizontal flips?

- ``fastfeed-turbo``: ``fastfeed.loader(num_workers=0, decode_backend="turbo")`` over
  ``fastfeed pack --no-jpeg-restarts`` tar shards (plain JPEGs; everything: shard reads,
  tar parsing, crop choice, DCT-scaled decode, of only the crop's region when the
  extension ``fastfeed._jpegroi`` is built (:mod:`fastfeed.decode.roi`), OpenCV resize
  into the batch buffer, labels, stats).
- ``fastfeed-turbo-rst``: the same over default ``fastfeed pack`` shards (restart
  markers: the same pixels, losslessly re-coded with a restart marker per 16x16 block,
  so a crop is cut out of the compressed data and only its blocks are decoded; packing
  needs the extension). This is the default install's path.
- ``fastfeed-turbo-rst-pycut``: the same shards with the extension switched off: the
  crop's segments are cut in Python and decoded by simplejpeg (an install without a C
  compiler).
- ``fastfeed-turbo-full``: plain shards with region decoding switched off (whole-image
  simplejpeg decode, as without the extension): the region decoding's share.
- ``fastfeed-pillow``: the default shards with ``decode_backend="pillow"`` (an install
  without simplejpeg or OpenCV).
- ``ffcv-ops``: the operations FFCV's ``RandomResizedCropRGBImageDecoder`` +
  ``RandomHorizontalFlip`` run per image (libjpeg-turbo full decode with fast DCT,
  torchvision's crop rule, ``cv2.resize`` with ``INTER_AREA``, flip), written here in a
  few lines over the same JPEG bytes *already in memory* (no file reads, no tar
  parsing: in its favour). This is not FFCV itself (``benchmarks/loader_cpu.py`` runs
  the real FFCV loader); it shows where per-core time goes.
- ``ffcv-ops-linear``: the same with bilinear resizing (what fastfeed uses when the crop
  is less than twice the output), to separate the resize's share from the rest.

CPU time (``time.process_time``) is reported besides wall time, because the machine
may be shared; passes of the pipelines interleave and the median of ``--repeat`` is printed.

Run::

    .venv/bin/python benchmarks/decode_per_core.py                 # 512 images, 500x375 q90
    .venv/bin/python benchmarks/decode_per_core.py --source real   # the 47 real photos, replicated
    .venv/bin/python benchmarks/decode_per_core.py --images 2048 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fastfeed  # noqa: E402
from fastfeed.decode.geometry import FLIP, NUM_UNIFORMS, random_resized_crop, uniforms  # noqa: E402
from tools.synth import make_image_folder  # noqa: E402


def ffcv_ops(datas: list[bytes], batch: int, size: int, interp: str) -> Callable[[], int]:
    import cv2
    import simplejpeg

    cv2.setNumThreads(1)
    flag = cv2.INTER_AREA if interp == "area" else cv2.INTER_LINEAR
    u = uniforms(seed=0, epoch=0, ids=np.arange(len(datas)), n=NUM_UNIFORMS)

    def run() -> int:
        for a in range(0, len(datas), batch):
            out = np.empty((min(batch, len(datas) - a), size, size, 3), np.uint8)
            for j in range(out.shape[0]):
                img = simplejpeg.decode_jpeg(datas[a + j], "RGB", fastdct=True)
                top, left, h, w = random_resized_crop(img.shape[0], img.shape[1], u[a + j])
                cv2.resize(img[top:top + h, left:left + w], (size, size), dst=out[j], interpolation=flag)
                if u[a + j, FLIP] < 0.5:
                    cv2.flip(out[j], 1, dst=out[j])
        return len(datas)

    return run


def fastfeed_pass(root: Path, batch: int, size: int, backend: str, ext: bool = True,
                  cut: bool = True) -> Callable[[], int]:
    dl = fastfeed.loader(root, batch_size=batch, image_size=size, num_workers=0, decode_backend=backend,
                         pin_memory=False)
    if not ext:  # num_workers=0: this process's decoder; as without _jpegroi (cut: Python restart cut)
        images = dl.dataset.decoder.images
        images._load()
        images._roi, images._cut = False, cut

    def run() -> int:
        return sum(len(b["__key__"]) for b in dl)

    return run


def timed(runs: dict[str, Callable[[], int]], repeat: int) -> dict[str, tuple[float, float]]:
    """Median (CPU, wall) img/s of each pipeline; passes interleave, so drifting load hits all."""
    for run in runs.values():
        run()  # warm: page cache, imports, lazy loads
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    wall: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            c0, w0 = time.process_time(), time.perf_counter()
            n = run()
            cpu[name].append(n / (time.process_time() - c0))
            wall[name].append(n / (time.perf_counter() - w0))
    return {k: (statistics.median(cpu[k]), statistics.median(wall[k])) for k in runs}


def real_folder(dst: Path, num_images: int) -> Path:
    """``shared/data/imagenet-sample``'s photos replicated to ``num_images`` files (ImageFolder)."""
    sample = ROOT.parent / "shared" / "data" / "imagenet-sample"
    photos = sorted(sample.rglob("*.jpg")) + sorted(sample.rglob("*.JPEG"))
    if not photos:
        raise SystemExit(f"{sample}: no photos (the real sample data is optional); use --source synth")
    for i in range(num_images):
        p = photos[i % len(photos)]
        out = dst / p.parent.name / f"{i:06d}.jpg"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(p.read_bytes())
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="128 images, 2 passes")
    ap.add_argument("--source", choices=("synth", "real"), default="synth",
                    help="synth: generated 500x375 q90 JPEGs; real: shared/data/imagenet-sample replicated")
    ap.add_argument("--data", type=Path, default=None, help="reuse this folder for the generated data")
    args = ap.parse_args(argv)
    if args.quick:
        args.images, args.repeat = min(args.images, 128), min(args.repeat, 2)
    tmp = tempfile.TemporaryDirectory()
    base = args.data or Path(tmp.name)
    src, packed = base / f"{args.source}-{args.images}", base / f"packed-{args.source}-{args.images}"
    if not (packed / "index.json").exists():
        if args.source == "synth":
            make_image_folder(src, num_images=args.images, num_classes=10, size=(500, 375), quality=90)
        else:
            real_folder(src, args.images)
        fastfeed.pack(src, packed, samples_per_shard=256, overwrite=True, jpeg_restarts=False)
    from fastfeed.decode import roi

    rst = packed.with_name(packed.name + "-rst")
    if roi.built() and not (rst / "index.json").exists():
        fastfeed.pack(src, rst, samples_per_shard=256, overwrite=True)  # the default: restart markers
    datas = [p.read_bytes() for p in sorted(src.rglob("*.jpg"))]
    what = "500x375 q90" if args.source == "synth" else "real photos (imagenet-sample)"
    print(f"{len(datas)} JPEGs ({what}), mean {np.mean([len(d) for d in datas]) / 1e3:.0f} KB -> "
          f"RandomResizedCrop {args.size} + flip, batch {args.batch}, 1 process")
    runs = {
        "fastfeed-turbo": fastfeed_pass(packed, args.batch, args.size, "turbo"),
        **({"fastfeed-turbo-rst": fastfeed_pass(rst, args.batch, args.size, "turbo"),
            "fastfeed-turbo-rst-pycut": fastfeed_pass(rst, args.batch, args.size, "turbo", ext=False)}
           if roi.built() else {}),
        "fastfeed-turbo-full": fastfeed_pass(packed, args.batch, args.size, "turbo", ext=False, cut=False),
        "fastfeed-pillow": fastfeed_pass(rst if roi.built() else packed, args.batch, args.size, "pillow"),
        "ffcv-ops": ffcv_ops(datas, args.batch, args.size, "area"),
        "ffcv-ops-linear": ffcv_ops(datas, args.batch, args.size, "linear"),
    }
    rates = timed(runs, args.repeat)
    ref = rates["ffcv-ops"][0]
    print(f"{'pipeline':<20}{'img/s per CPU-s':>16}{'ms CPU/img':>11}{'img/s wall':>12}{'vs ffcv-ops':>13}")
    for name, (cpu, wall) in rates.items():
        print(f"{name:<20}{cpu:>16.0f}{1e3 / cpu:>11.2f}{wall:>12.0f}{cpu / ref:>12.2f}x")
    print(f"region decoding (fastfeed._jpegroi): {'built' if roi.available() else 'NOT built'}; "
          f"fastfeed-turbo / fastfeed-turbo-full: {rates['fastfeed-turbo'][0] / rates['fastfeed-turbo-full'][0]:.2f}x")
    if "fastfeed-turbo-rst" in rates:
        default = rates["fastfeed-turbo-rst"][0]
        print(f"restart markers (pack's default): fastfeed-turbo-rst / fastfeed-turbo: "
              f"{default / rates['fastfeed-turbo'][0]:.2f}x")
        print("CPU per image of each fallback vs the default path (fastfeed-turbo-rst): " + ", ".join(
            f"{k} {default / rates[k][0]:.2f}x" for k in
            ("fastfeed-turbo-rst-pycut", "fastfeed-turbo", "fastfeed-turbo-full", "fastfeed-pillow")))
    ratio = rates["fastfeed-turbo"][0] / ref
    print(f"goal: fastfeed-turbo >= 1.0x ffcv-ops per core: {ratio:.2f}x -> {'pass' if ratio >= 1.0 else 'FAIL'}")
    print("RESULT " + json.dumps({
        "source": args.source, "images": len(datas), "img_per_cpu_s": {k: round(v[0], 1) for k, v in rates.items()},
        "ratio_vs_ffcv_ops": round(ratio, 3), "goal": 1.0, "pass": ratio >= 1.0,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
