"""Goal: shards on object storage >= 10x one GET per image, and >= 0.9x local disk once cached.

One run, one S3-compatible server (moto, in its own process on 127.0.0.1), the same
ImageNet-like JPEGs (generated, ~500x375, q90) stored twice in the same bucket: as loose
objects (``loose/<class>/<name>.jpg``) and packed into tar shards by ``fastfeed pack``
(``packed/``). Every configuration uses the same pipeline (fastfeed's CPU decoder:
decode -> RandomResizedCrop -> flip -> one uint8 batch), the same batch size and the
same number of DataLoader worker processes, and is measured by the one measuring core
(:func:`fastfeed.timing.measure.measure`: warm-up, then the median of windows of steady batches):

==================  ==========================================================================
``local``           ``fastfeed.loader`` over the packed folder on local disk (page cache warm)
``s3-cold``         ``fastfeed.loader("s3://...", cache_dir=<empty>)``: one epoch, every shard
                    downloaded once into the host cache while training reads
``s3-warm``         the same with the cache filled (a later epoch or run): reads local disk
``s3-nocache``      ``fastfeed.loader("s3://...")`` without ``cache_dir``: whole shards into each
                    worker's memory
``loose-get``       ``torch.utils.data.DataLoader`` over the loose objects: one boto3
                    ``get_object`` per image in the workers, then the same decode
==================  ==========================================================================

Goals: ``s3-cold / loose-get >= 10`` (shards vs one GET per image, both from the
bucket) and ``s3-warm / local >= 0.9``. ``--io-only`` adds the same comparisons with
``decode=None`` (no JPEG decode: transport only).

moto on loopback answers in well under a millisecond; a real object store takes tens of
milliseconds to the first byte of every GET, which costs ``loose-get`` once per image and
the shard reads once per 8 MB part. ``--latency-ms 20`` puts a proxy in front of moto that
delays every request by that much, to show the difference on the same data.

Run (dev machine, 2 cores; ~15 minutes each, the first one also generates the data)::

    .venv/bin/python benchmarks/loader_s3.py --io-only --repeat 3
    .venv/bin/python benchmarks/loader_s3.py --io-only --repeat 2 --latency-ms 20

Run (more cores)::

    python benchmarks/loader_s3.py --images 10000 --workers 8 --batch 128
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed.decode.cpu import CpuDecoder  # noqa: E402
from fastfeed.host import cpu_count, host_info  # noqa: E402
from fastfeed.packed.index import DatasetIndex  # noqa: E402

from benchmarks.lib.data import BENCH_DATA, synth_image_folder  # noqa: E402
from benchmarks.lib.loaders import fastfeed_loader  # noqa: E402
from benchmarks.lib.measure import Measurement, Stopwatch, measure  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context  # noqa: E402

BUCKET = "fastfeed-bench"
#: the configurations, in the order of a round (s3-warm reads the cache s3-cold filled)
CONFIGS = ("local", "s3-cold", "s3-warm", "s3-nocache", "loose-get")
CREDS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench", "region_name": "us-east-1"}


# ---------------------------------------------------------------------- the server
async def _latency_proxy(listen_port_q: Any, upstream_port: int, latency_s: float) -> None:
    """TCP proxy that holds every client->server write for ``latency_s`` (one request's
    round trip to a distant object store); responses stream back at loopback speed."""
    import asyncio

    async def pipe(reader: Any, writer: Any, delay: float) -> None:
        try:
            while data := await reader.read(1 << 16):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(c_reader: Any, c_writer: Any) -> None:
        u_reader, u_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(pipe(c_reader, u_writer, latency_s), pipe(u_reader, c_writer, 0.0))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    listen_port_q.put(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def _serve(port_q: Any, stop: Any, latency_ms: float) -> None:
    import asyncio
    import logging
    import threading

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    port_q.put(port)
    if latency_ms > 0:
        threading.Thread(target=lambda: asyncio.run(_latency_proxy(port_q, port, latency_ms / 1000)),
                         daemon=True).start()
    else:
        port_q.put(port)
    stop.wait()
    server.stop()


class MotoProcess:
    """moto's S3 server in a child process (so it does not share the GIL with the loaders).

    With ``latency_ms`` the endpoint is a proxy that delays each request by that much.
    """

    def __init__(self, latency_ms: float = 0.0) -> None:
        self.latency_ms = latency_ms

    def __enter__(self) -> "MotoProcess":
        ctx = mp.get_context("spawn")
        q, self._stop = ctx.Queue(), ctx.Event()
        self._proc = ctx.Process(target=_serve, args=(q, self._stop, self.latency_ms), daemon=True)
        self._proc.start()
        self.direct_endpoint = f"http://127.0.0.1:{q.get(timeout=120)}"  # for uploads
        self.endpoint = f"http://127.0.0.1:{q.get(timeout=60)}"  # what the loaders use
        self.storage_options = {
            "key": CREDS["aws_access_key_id"], "secret": CREDS["aws_secret_access_key"],
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": CREDS["region_name"]},
        }
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._proc.join(timeout=10)

    def client(self) -> Any:
        """A boto3 client on the direct (no added latency) endpoint, for setting up."""
        import boto3

        return boto3.client("s3", endpoint_url=self.direct_endpoint, **CREDS)


# ---------------------------------------------------------------------- data
def prepare_data(root: Path, images: int, per_shard: int) -> tuple[Path, Path]:
    """ImageFolder of generated JPEGs (``bench-data/synth-N``) and its packed shards (reused when there)."""
    import fastfeed

    imgs, packed = synth_image_folder(images), root / f"packed-{images}-{per_shard}"
    if not DatasetIndex.exists(packed):
        shutil.rmtree(packed, ignore_errors=True)
        fastfeed.pack(str(imgs), str(packed), samples_per_shard=per_shard, workers=cpu_count())
    return imgs, packed


def upload(server: MotoProcess, imgs: Path, packed: Path) -> list[tuple[str, int]]:
    """Put the loose images and the shards into the bucket; return (loose key, label)."""
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    files = sorted(p for p in imgs.rglob("*.jpg"))
    classes = sorted({p.parent.name for p in files})
    loose = [(f"loose/{p.parent.name}/{p.name}", classes.index(p.parent.name)) for p in files]
    jobs = [(str(p), k) for p, (k, _) in zip(files, loose)] + [
        (str(p), f"packed/{p.name}") for p in sorted(packed.iterdir()) if p.is_file()
    ]
    with Stopwatch() as took, ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda job: client.upload_file(job[0], BUCKET, job[1]), jobs))
    print(f"uploaded {len(jobs)} objects in {took.wall:.0f}s", flush=True)
    return loose


# ---------------------------------------------------------------------- the peer: one GET per image
class LooseObjects:
    """Map-style dataset: one ``get_object`` per image, boto3 client per worker process."""

    def __init__(self, endpoint: str, items: list[tuple[str, int]]) -> None:
        self.endpoint, self.items = endpoint, items
        self._client: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._pid != os.getpid():
            import boto3

            self._client, self._pid = boto3.client("s3", endpoint_url=self.endpoint, **CREDS), os.getpid()
        key, label = self.items[i]
        body = self._client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return {"__key__": key, "jpg": body, "cls": str(label).encode(), "__id__": i}


class DecodeBatch:
    """collate_fn: fastfeed's CPU decoder, so both sides decode and crop identically."""

    def __init__(self, image_size: int | None) -> None:
        self.decoder = CpuDecoder(image_size=image_size, seed=0) if image_size else None

    def __call__(self, samples: list[dict[str, Any]]) -> Any:
        if self.decoder is None:  # I/O only
            return {"__key__": [s["__key__"] for s in samples], "jpg": [s["jpg"] for s in samples]}
        ids = np.array([s.pop("__id__") for s in samples])
        return self.decoder.decode_batch(samples, ids, epoch=0, labels=None, fail=None)


def loose_loader(server: MotoProcess, items: list[tuple[str, int]], args: argparse.Namespace,
                 image_size: int | None) -> Any:
    import torch
    from torch.utils.data import DataLoader

    return DataLoader(
        LooseObjects(server.endpoint, items), batch_size=args.batch, shuffle=True,
        generator=torch.Generator().manual_seed(0), num_workers=args.workers, prefetch_factor=2,
        persistent_workers=True, collate_fn=DecodeBatch(image_size), drop_last=True,
    )


# ---------------------------------------------------------------------- measuring
def run(name: str, source: Any, args: argparse.Namespace, *, one_epoch: bool = False,
        startup_allowance: float = 0.0) -> Measurement:
    """One measurement; ``startup_allowance`` extends ``--max-time`` for downloads before the first batch."""
    src = iter(source) if one_epoch else (lambda: iter(source))
    m = measure(src, num_workers=args.workers, prefetch_factor=2, min_batches=args.min_batches,
                min_time=args.min_time, max_time=args.max_time + startup_allowance)
    note = "" if m.batches else "  NO STEADY BATCH: start-up took the whole --max-time; not a rate"
    print(f"  {name:<22} {m.samples_per_s:8.0f} img/s  (p10 {m.p10_samples_per_s:.0f}, p90 "
          f"{m.p90_samples_per_s:.0f}, {m.batches} steady batches, start-up {m.startup_s:.1f}s){note}",
          flush=True)
    return m


def rate_of(ms: list[Measurement]) -> float:
    """Median steady img/s of the rounds that timed steady batches (NaN when none did)."""
    rates = [m.samples_per_s for m in ms if m.batches]
    return float(np.median(rates)) if rates else float("nan")


def ff_loader(path: str, args: argparse.Namespace, image_size: int | None, **kw: Any) -> Any:
    """fastfeed's loader of every configuration (``kw``: where the shards come from, the cache)."""
    return fastfeed_loader(path, batch_size=args.batch, image_size=image_size, workers=args.workers, prefetch=2,
                           rank=0, world_size=1, drop_last=True, seed=0, decode="cpu" if image_size else None, **kw)


def measure_all(server: MotoProcess, packed: Path, loose: list[tuple[str, int]], args: argparse.Namespace,
                image_size: int | None, tag: str, configs: tuple[str, ...] = CONFIGS) -> dict[str, list[Measurement]]:
    """Every configuration, ``--repeat`` rounds in rotation (a fresh, empty cache for each cold run)."""
    url = f"s3://{BUCKET}/packed"
    so = server.storage_options
    out: dict[str, list[Measurement]] = {}
    for round_ in range(args.repeat):
        print(f"{tag}, round {round_ + 1} of {args.repeat}:", flush=True)
        cache = Path(tempfile.mkdtemp(prefix="ff-s3-cache-", dir=args.cache_parent))
        try:
            runs = {
                "local": lambda: run("local disk", ff_loader(str(packed), args, image_size), args),
                "s3-cold": lambda: run("s3, cold cache_dir", ff_loader(
                    url, args, image_size, storage_options=so, cache_dir=cache), args, one_epoch=True,
                    startup_allowance=60),
                "s3-warm": lambda: run("s3, warm cache_dir", ff_loader(
                    url, args, image_size, storage_options=so, cache_dir=cache), args),
                "s3-nocache": lambda: run("s3, no cache_dir", ff_loader(
                    url, args, image_size, storage_options=so), args, startup_allowance=60),
                "loose-get": lambda: run("loose, 1 GET / image", loose_loader(server, loose, args, image_size),
                                         args),
            }
            for name, fn in runs.items():
                if name in configs:
                    out.setdefault(name, []).append(fn())
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return out


def report(results: dict[str, dict[str, list[Measurement]]], args: argparse.Namespace) -> dict[str, Any]:
    """Median img/s per configuration over the rounds, and the ratios of the goals."""
    summary: dict[str, Any] = {"date": datetime.date.today().isoformat(), "host": str(host_info()),
                               "args": {k: str(v) for k, v in vars(args).items() if k != "point"}, "runs": {}}
    goals = {"s3-cold / loose-get": 10.0, "s3-warm / local": 0.9}
    print("\nmedian img/s over rounds, and ratios:")
    for tag, r in results.items():
        rate = {k: rate_of(r.get(k, [])) for k in CONFIGS}
        print(f"  [{tag}] " + ", ".join(f"{k} {v:.0f}" for k, v in rate.items()))
        ratios = {
            "s3-cold / loose-get": rate["s3-cold"] / rate["loose-get"],
            "s3-warm / loose-get": rate["s3-warm"] / rate["loose-get"],
            "s3-nocache / loose-get": rate["s3-nocache"] / rate["loose-get"],
            "s3-warm / local": rate["s3-warm"] / rate["local"],
            "s3-cold / local": rate["s3-cold"] / rate["local"],
        }
        for k, v in ratios.items():
            goal = ""
            if k in goals and tag == "decode":
                goal = f"(goal >= {goals[k]}: {'met' if v >= goals[k] else 'NOT met'})"
            print(f"  [{tag}] {k:<24} {v:6.2f}x {goal}")
        summary["runs"][tag] = {
            "img_per_s": rate, "ratios": ratios,
            "all_img_per_s": {k: [m.samples_per_s if m.batches else None for m in ms] for k, ms in r.items()},
            "startup_s": {k: [m.startup_s for m in ms] for k, ms in r.items()},
        }
    return summary


def options(p: argparse.ArgumentParser) -> None:
    """Sizes, workers, the measurement's bounds, the added latency."""
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--per-shard", type=int, default=250, help="images per shard")
    p.add_argument("--workers", type=int, default=cpu_count())
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--min-batches", type=int, default=20)
    p.add_argument("--min-time", type=float, default=5.0)
    p.add_argument("--max-time", type=float, default=40.0)
    p.add_argument("--io-only", action="store_true", help="also measure with decode=None")
    p.add_argument("--latency-ms", type=float, default=0.0,
                   help="delay every request by this much (a proxy in front of moto), as a distant store would")
    p.add_argument("--data", type=Path, default=BENCH_DATA / "s3")
    p.add_argument("--cache-parent", default=None, help="where the cache_dir is made (default: TMPDIR)")


def run_all_configs(ctx: Context) -> dict[str, Any]:
    """The server up, the data uploaded; every configuration of the grid in rounds; the ratios."""
    args = ctx.args
    imgs, packed = prepare_data(args.data, args.images, args.per_shard)
    configs = tuple(ctx.grid["config"])
    with MotoProcess(args.latency_ms) as server:
        loose = upload(server, imgs, packed)
        results = {"decode": measure_all(server, packed, loose, args, args.image_size, "decode", configs)}
        if args.io_only:
            results["io-only"] = measure_all(server, packed, loose, args, None, "io-only", configs)
    return report(results, args)


BENCHMARK = Benchmark(
    name="loader_s3", doc=__doc__, options=options, run=run_all_configs, needs=("moto", "boto3", "s3fs"),
    grid=(REPEAT, Axis("config", CONFIGS, help="where the loader reads from (see the table above)")),
    quick={"images": 800, "per_shard": 100, "min_batches": 8, "min_time": 1.0, "max_time": 15.0, "repeat": 1},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
