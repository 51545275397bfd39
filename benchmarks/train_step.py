"""Goal: measure how long a real training step waits for data, fed by each loader (issue 31, part 1).

Every speed figure of the loaders alone says little about a training job, where the loader
shares the host (and, for DALI, the GPU) with the step. This benchmark trains a real model and
reports, for each feeder, img/s and the share of step time spent waiting for data, measured two
ways in the same process, one after the other on the same running loader:

- **plain**: steps ``START..END-1`` of ``--window START:END`` (the ``START`` steps before are
  untimed, so that the queue the workers filled before the first step has drained); the loop
  times ``next()`` and the whole step on the host clock, with the training stream synchronised
  after each step (``torch.cuda.current_stream().synchronize()``: a device-wide sync would also
  wait for DALI's decoding of the batches ahead), so the time the step waited for its batch is
  on that clock;
- **monitor**: the next ``END - START`` steps (plus one: the monitor leaves its first step out, as
  start-up) under ``fastfeed.StepMonitor(every=--every)``, without any per-step
  synchronisation (CUDA events, read two steps late): its data share, its verdict and its fix.
  The img/s of this pass is its wall clock (one synchronisation at each end).

The default window, ``100:250``, times the 300 steps after the first 100 (the issue's steps
100-400), half of them each way. The step and both passes are :mod:`benchmarks.lib.imagestep`.

Feeders (``--feeders``), each over the same images:

- ``imagefolder``: torchvision ``ImageFolder`` over the raw folder, PIL decode,
  RandomResizedCrop + flip + PILToTensor, ``DataLoader(shuffle=True, persistent_workers=True,
  pin_memory=<on CUDA>)`` with ``--imagefolder-workers`` (default: every core) workers;
- ``fastfeed``: the defaults: ``fastfeed.pack(folder, dst)``, then
  ``fastfeed.loader(dst, batch_size=B, image_size=S)`` and nothing else (``num_workers="auto"``,
  with no tune result: the loader's heuristic);
- ``fastfeed-tuned``: ``fastfeed.tune(dst, batch_size=B, image_size=S)`` once per run (before
  the first point; ``--tune-budget`` for its time budget, default tune's own), stored in a folder
  of this run that the loader finds (``FASTFEED_TUNE_DIR``, set for this feeder only, so the
  ``fastfeed`` feeder never sees it), then the same default loader;
- ``dali``: ``fastfeed.loader(dst, batch_size=B, image_size=S, decode="dali")`` with DALI's
  default knobs (on a machine without CUDA ``dali=fastfeed.Dali(device_id=None)``: DALI on the CPU,
  a check of the code path, not a figure);
- ``autotune`` (only when named): the convergence of the loader's own tuning (issue 31, part 4).
  It starts from a bad setting, a stored tune record of ``--autotune-start`` (2) workers and
  prefetch factor 2 (as a tune of another job would leave), then the same default loader
  (``num_workers="auto"``, ``Workers(autotune=True)``) runs ``--autotune-epochs`` (6) whole
  epochs, each step timed plainly; a row per epoch: img/s, the data-wait share (and without the
  epoch's first step), the setting, and the changes the loader logged.

Models (``--model``): ``resnet18`` and ``resnet50`` (torchvision, 1000 classes, ``channels_last``,
bf16 autocast, SGD with momentum; batch 256, 224 px; ``torch.backends.cudnn.benchmark``) on the
GPU; ``cnn`` (3 convolutions, batch 32, 64 px, fp32, one intra-op thread: ``--threads``) for a
CPU-only machine, the default there. Images go to the device inside the step
(``non_blocking``), normalised there. Each point runs in a fresh process.

Data: ``--images`` ImageNet-sized JPEGs in ``--classes`` (100) class folders, cut from the real sample photos
(``shared/data/imagenet-sample``, or ``.dali-bench/imagenet-sample`` on the GPU machine) by
:func:`benchmarks.lib.data.photo_variants`, packed with pack's defaults; made once under
``bench-data/`` (``FASTFEED_BENCH_DATA``). The default count, ``END x B``, puts the end of the first
epoch exactly at the monitored pass's first step (which the monitor leaves out): with persistent
workers a new epoch starts with an empty queue (the workers refill it from ``iter()`` on), a cost
an ImageNet epoch (5,000 steps) pays once and a small dataset every few steps. Each row says how
many epoch starts fell in its steps, and the plain figure is also given without them.

The report (per model): img/s and data-wait share, plain and monitor, the monitor's verdict, and
the ratio of each feeder's img/s to ImageFolder's measured in the same run. A feeder whose library
is missing is skipped and the report says so (torchvision: ``make bench-env``; DALI: on the GPU
machine, ``benchmarks/gpu_setup.sh``).

Run (dev machine, 2 cores; the small CNN, 768 images; under 2 min)::

    .venv-bench/bin/python benchmarks/run.py train_step --model cnn --device cpu --tune-budget 20s
    .venv/bin/python benchmarks/run.py train_step --model cnn --device cpu --feeders fastfeed,dali  # DALI on the CPU

Run (GPU machine, one H200, 16 cores: ResNet-18 and ResNet-50, the four feeders, 64,000 images;
~6 min), after ``source benchmarks/gpu_setup.sh`` and building ``fastfeed/_jpegroi`` and
``fastfeed/_resize`` for its Python as ``pip install .`` would (the two ``gcc`` lines of
``gpu_runs.sh``'s ``raw`` stage; benchmarks/RESULTS.md has the whole command)::

    FASTFEED_BENCH_DATA=/tmp/bench-data python3 benchmarks/run.py train_step --window 100:250 \\
        --json $OUT/train_step.json

The autotune convergence run (2 workers to start; the CPU machine, then the GPU machine's ResNets)::

    .venv-bench/bin/python benchmarks/run.py train_step --model cnn --device cpu --feeders autotune
    FASTFEED_BENCH_DATA=/tmp/bench-data python3 benchmarks/run.py train_step --model resnet18,resnet50 \\
        --feeders autotune --autotune-epochs 6 --json $OUT/train_step_autotune.json
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed.host import cpu_count  # noqa: E402

from benchmarks.lib.converge import bad_start, print_converge  # noqa: E402
from benchmarks.lib.data import BENCH_DATA, pack_defaults, photo_variants, sample_photos, warm  # noqa: E402
from benchmarks.lib.imagestep import batches, epoch_passes, monitored_pass, plain_pass, stream_sync, trainer  # noqa: E402
from benchmarks.lib.loaders import epochs, fastfeed_loader, shutdown  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.report import fmt_rate, log, pct, write_json  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402

MODELS = ("resnet18", "resnet50", "cnn")
FEEDERS = ("imagefolder", "fastfeed", "fastfeed-tuned", "dali")
AUTOTUNE = "autotune"  # the convergence run: only when asked for (--feeders autotune)
PEER = "imagefolder"  # the ratios' denominator
WORK = BENCH_DATA / "train_step"


# ---------------------------------------------------------------------- the run's shape
@dataclass(frozen=True)
class Shape:
    """Batch, image size, the timed window and the dataset size of one run."""

    batch: int
    image: int
    start: int  # untimed steps before the plain pass
    end: int  # the plain pass is steps start..end-1; the monitored pass as many more
    images: int

    @property
    def steps(self) -> int:
        """Steps of each pass."""
        return self.end - self.start


def _window(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    try:
        start, end = int(a), int(b)
    except ValueError:
        start = end = -1
    if not sep or start < 1 or end <= start:
        raise argparse.ArgumentTypeError(f"--window {text!r}: want START:END with 1 <= START < END (steps 100-400: "
                                         "100:400)")
    return start, end


def shape_of(model: str, args: argparse.Namespace) -> Shape:
    """The shape of a run of ``model`` (``cnn``: the small CPU one), the command line's values first."""
    small = model == "cnn"
    batch = args.batch_size or (32 if small else 256)
    start, end = args.window or ((8, 24) if small else (100, 250))
    return Shape(batch=batch, image=args.image_size or (64 if small else 224), start=start, end=end,
                 images=args.images or end * batch)


def options(ap: argparse.ArgumentParser) -> None:
    """The device, the shape, the data, the feeders' settings."""
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda when present")
    ap.add_argument("--batch-size", type=int, default=None, help="default: 256 (ResNets), 32 (cnn)")
    ap.add_argument("--image-size", type=int, default=None, help="default: 224 (ResNets), 64 (cnn)")
    ap.add_argument("--window", type=_window, default=None, metavar="START:END",
                    help="steps START..END-1 timed plainly, then END-START monitored (default 100:250; cnn 8:24)")
    ap.add_argument("--images", type=int, default=None,
                    help="images of the dataset (default END x batch: the first epoch ends where the monitored "
                         "pass starts)")
    ap.add_argument("--classes", type=int, default=100, help="class folders of the dataset")
    ap.add_argument("--imagefolder-workers", type=int, default=None, help="ImageFolder's workers (default: cores)")
    ap.add_argument("--tune-budget", default=None, help="fastfeed.tune's time_budget (default: tune's own, 60s)")
    ap.add_argument("--tune-step-time", type=float, default=None,
                    help="fastfeed.tune's step_time (seconds per batch: the step's own, measured; default none)")
    ap.add_argument("--every", type=int, default=50, help="the step monitor's window, in steps")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads on the CPU")
    ap.add_argument("--lr", type=float, default=0.02, help="SGD's learning rate")
    ap.add_argument("--autotune-epochs", type=int, default=6, help="epochs of the autotune convergence run")
    ap.add_argument("--autotune-start", type=int, default=2,
                    help="the autotune run's starting workers (a stored tune record; prefetch factor 2)")


def _cuda(args: argparse.Namespace) -> bool:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_step: --device cuda, but no CUDA GPU is visible here")
    return args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())


def _models_given(args: argparse.Namespace) -> bool:
    return args.grid_model is not None or any(g.startswith("model=") for g in args.grid) or args.quick


# ---------------------------------------------------------------------- data, once per run
def prepare(ctx: Context) -> dict[str, Path]:
    """The models' shape, the folder and its pack; ``fastfeed.tune`` when the tuned feeder runs."""
    args = ctx.args
    if not _cuda(args) and not _models_given(args):
        ctx.grid["model"] = ("cnn",)
        log("train_step: no CUDA GPU here: the small CNN (--model cnn); the ResNets are for the GPU machine")
    kinds = {m == "cnn" for m in ctx.grid["model"]}
    if len(kinds) > 1:
        raise SystemExit("train_step: --model cnn runs on its own (its batch, image size and data differ)")
    s = shape_of(ctx.grid["model"][0], args)
    folder = photo_variants(s.images, num_classes=args.classes, src=sample_photos())
    data: dict[str, Path] = {"folder": folder}
    feeders = set(ctx.grid["feeder"])
    if feeders - {"imagefolder"}:
        data["packed"] = pack_defaults(folder)
    if "fastfeed-tuned" in feeders:
        data["tune_dir"], data["tune_result"] = _tune(data["packed"], s, args.tune_budget, args.tune_step_time)
    read = [p for p in (folder if "imagefolder" in feeders else None, data.get("packed")) if p is not None]
    with Stopwatch() as took:
        cached = warm(*read)
    log(f"page cache warm: {cached.files} files, {cached.bytes / 1e9:.1f} GB read in {took.wall:.1f} s")
    return data


def _tune(packed: Path, s: Shape, budget: str | None, step_time: float | None) -> tuple[Path, Path]:
    """``fastfeed.tune(packed, batch_size, image_size)`` (and ``step_time``), stored in a folder of this run
    (emptied first)."""
    import fastfeed

    store = WORK / f"tune-{packed.name}-b{s.batch}-s{s.image}"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    with Stopwatch() as took:
        res = fastfeed.tune(packed, batch_size=s.batch, image_size=s.image, store_dir=store,
                            **({"time_budget": budget} if budget else {}),
                            **({"step_time": step_time} if step_time else {}))
    log(f"fastfeed.tune in {took.wall:.0f} s: {res.summary()}")
    result = store / "tune-result.json"
    write_json(result, {**res.to_json(), "wall_s": took.wall, "step_time": step_time})
    return store, result


# ---------------------------------------------------------------------- the feeders
@dataclass
class Feed:
    """A feeder ready to run: ``epoch()`` starts a pass, ``split`` gives (images, labels) of a batch."""

    what: str
    loader: Any
    epoch: Callable[[], Iterator[Any]]
    split: Callable[[Any], tuple[Any, Any]]
    settings: dict[str, Any]
    close: Callable[[], None]


def _by_key(batch: Any) -> tuple[Any, Any]:
    return batch["image"], batch["label"]


def _pair(batch: Any) -> tuple[Any, Any]:
    return batch[0], batch[1]


def _feed(name: str, data: dict[str, Path], s: Shape, cuda: bool, args: argparse.Namespace) -> Feed:
    """Build feeder ``name`` (in the point's process)."""
    if name == "imagefolder":
        from benchmarks.lib.peers import Setup, imagefolder_pil

        workers = args.imagefolder_workers or cpu_count()
        built = imagefolder_pil({"folder": data["folder"]}, Setup(workers=workers, batch_size=s.batch,
                                                                   image_size=s.image, pin_memory=cuda))
        return Feed(f"{built.what}, {workers} workers, pin_memory={cuda}", built.extra["loader"], built.epoch,
                    _pair, {"num_workers": workers, "prefetch_factor": 2, "pin_memory": cuda}, built.close)
    if name in ("fastfeed", "fastfeed-tuned"):  # the tune result is found through FASTFEED_TUNE_DIR (or not)
        from fastfeed.decode.image import decode_path

        dl = fastfeed_loader(data["packed"], batch_size=s.batch, image_size=s.image)
        settings = {"num_workers": dl.num_workers, "prefetch_factor": dl.prefetch_factor, "from": dl.workers_from,
                    "pin_memory": dl.pin_memory}
        what = (f"fastfeed.loader(path, batch_size={s.batch}, image_size={s.image}): num_workers='auto' -> "
                f"{dl.num_workers} ({dl.workers_from}), prefetch_factor {dl.prefetch_factor}; {decode_path().message}")
        return Feed(what, dl, epochs(dl), _by_key, settings, lambda: shutdown(dl))
    import fastfeed

    dl = fastfeed_loader(data["packed"], batch_size=s.batch, image_size=s.image, decode="dali",
                         dali=None if cuda else fastfeed.Dali(device_id=None))
    d = dl.options.dali
    knobs = {k: getattr(d, k) for k in ("num_threads", "hw_decoder_load", "prefetch_queue_depth", "num_pipelines")}
    where = f"GPU {d.device_id}" if d.device_id is not None else "the CPU (a check of the code path)"
    what = (f"fastfeed.loader(path, batch_size={s.batch}, image_size={s.image}, decode='dali') on {where}: "
            f"{', '.join(f'{k}={v}' for k, v in knobs.items())} ({dl.options.knobs_from})")
    return Feed(what, dl, epochs(dl), _by_key, {**knobs, "from": dl.options.knobs_from}, lambda: None)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing (nvidia without nvidia.dali)
        return False


def skip(point: Point, ctx: Context) -> str | None:
    """A feeder or model whose library is missing here."""
    if point["model"] != "cnn" and not _installed("torchvision"):
        return f"{point['model']}: skipped (torchvision is not installed here; `make bench-env` builds .venv-bench)"
    if point["feeder"] == "imagefolder" and not _installed("torchvision"):
        return "imagefolder: skipped (torchvision is not installed here; `make bench-env` builds .venv-bench with it)"
    if point["feeder"] == "dali" and not _installed("nvidia.dali"):
        return ("dali: skipped (NVIDIA DALI is not installed here: pip install 'fastfeed[dali]'; on the GPU "
                "machine: source benchmarks/gpu_setup.sh)")
    return None


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """One feeder under one model: warm-up, the plain pass, the monitored pass (in a fresh process)."""
    import torch

    args, name = ctx.args, point["feeder"]
    cuda = _cuda(args)
    s = shape_of(point["model"], args)
    if cuda:
        torch.backends.cudnn.benchmark = True
    else:  # one intra-op thread: two on a shared 2-core machine slow the step and make it noisy
        torch.set_num_threads(args.threads)
    if name == AUTOTUNE:
        return _converge(point, ctx, s, cuda)
    if name == "fastfeed-tuned":
        os.environ["FASTFEED_TUNE_DIR"] = str(ctx.data["tune_dir"])
    else:  # the other feeders run on defaults: no tune result of this run (nor the caller's) applies
        os.environ.pop("FASTFEED_TUNE_DIR", None)
    feed = _feed(name, ctx.data, s, cuda, args)
    step = trainer(point["model"], cuda=cuda, lr=args.lr)
    sync = stream_sync(cuda)
    stream = batches(feed.epoch, feed.split)
    try:
        with Stopwatch() as first:
            images, labels, _ = next(stream)
        step(images, labels)
        for _ in range(s.start - 1):
            step(*next(stream)[:2])
        plain = plain_pass(stream, step, s.steps, sync)
        monitored = monitored_pass(stream, step, s.steps, feed.loader, args.every, sync)
    finally:
        feed.close()
    notes = []
    if name == "fastfeed" and feed.settings.get("from") != "heuristic":
        notes.append(f"not the defaults: num_workers came from {feed.settings.get('from')} (a stored tune result?)")
    if name == "fastfeed-tuned" and feed.settings.get("from") != "tuned":
        notes.append(f"the tune result was not used: num_workers came from {feed.settings.get('from')}")
    return {"what": feed.what, "settings": feed.settings, "first_batch_s": first.wall, "plain": plain,
            "monitor": {**monitored, "clock": "cuda" if cuda else "host"}, "notes": notes,
            "loadavg_1m": os.getloadavg()[0],
            "device": torch.cuda.get_device_name() if cuda else "cpu"}


# ---------------------------------------------------------------------- autotune's convergence
def _converge(point: Point, ctx: Context, s: Shape, cuda: bool) -> dict[str, Any]:
    """The default loader from a bad stored setting, autotune on: whole epochs, a row each."""
    import torch

    args = ctx.args
    store = WORK / f"autotune-start-{ctx.data['packed'].name}-b{s.batch}-s{s.image}-w{args.autotune_start}"
    os.environ["FASTFEED_TUNE_DIR"] = str(bad_start(ctx.data["packed"], store, batch=s.batch, image=s.image,
                                                    workers=args.autotune_start))
    dl = fastfeed_loader(ctx.data["packed"], batch_size=s.batch, image_size=s.image)
    if dl.autotune is None or dl.workers_from != "tuned":
        raise SystemExit(f"train_step autotune: the loader did not start from the stored record "
                         f"(num_workers from {dl.workers_from}, autotune {dl.autotune is not None})")
    start = {"num_workers": dl.num_workers, "prefetch_factor": dl.prefetch_factor, "from": dl.workers_from,
             "max_workers": dl.autotune.limits.max_workers, "max_prefetch": dl.autotune.limits.max_prefetch}

    def setting() -> dict[str, Any]:
        return {"num_workers": dl.num_workers, "prefetch_factor": dl.prefetch_factor}

    step = trainer(point["model"], cuda=cuda, lr=args.lr)
    try:
        rows = epoch_passes(epochs(dl), _by_key, step, args.autotune_epochs, stream_sync(cuda), setting)
    finally:
        shutdown(dl)
    what = (f"fastfeed.loader(path, batch_size={s.batch}, image_size={s.image}) from a stored record of "
            f"{start['num_workers']} workers, prefetch {start['prefetch_factor']}; autotune up to "
            f"{start['max_workers']} workers, prefetch {start['max_prefetch']}")
    return {"what": what, "settings": start, "epochs": rows, "changes": list(dl.autotune.changes),
            "at_limit": dl.autotune.limit,
            "loadavg_1m": os.getloadavg()[0], "device": torch.cuda.get_device_name() if cuda else "cpu"}


def progress(point: Point, row: dict[str, Any]) -> str:
    """One line per point, as soon as it is measured."""
    if point["feeder"] == AUTOTUNE:
        return "; ".join(f"epoch {e['epoch']} data {pct(e['data_share_after_first'])} at "
                         f"{e['at_end']['num_workers']}x{e['at_end']['prefetch_factor']}" for e in row["epochs"])
    p, m = row["plain"], row["monitor"]
    return (f"plain {fmt_rate(p['img_s'])} img/s, data {p['data_share']:.1%}; monitor {fmt_rate(m['img_s'])} img/s, "
            f"data {m['data_share']:.1%}, {m['verdict']}")


# ---------------------------------------------------------------------- the report
def _median(rows: list[dict[str, Any]], phase: str, key: str) -> float | None:
    vals = [r[phase][key] for r in rows if r[phase].get(key) is not None]
    return statistics.median(vals) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None




def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """One model's table: img/s and data wait (plain, monitor), the verdict, the ratio against ImageFolder."""
    if not rows:  # every point skipped (the runner said why) or failed
        return {}
    converging = [(pt, r) for pt, r in rows if pt["feeder"] == AUTOTUNE]
    rows = [(pt, r) for pt, r in rows if pt["feeder"] != AUTOTUNE]
    if converging and not rows:
        return _converge_report(converging, ctx)
    extra = _converge_report(converging, ctx) if converging else None
    model = rows[0][0]["model"]
    s, cuda = shape_of(model, ctx.args), _cuda(ctx.args)
    by: dict[str, list[dict[str, Any]]] = {}
    for pt, row in rows:
        by.setdefault(pt["feeder"], []).append(row)
    summary = {f: {"plain_img_s": _median(rs, "plain", "img_s"), "plain_data_share": _median(rs, "plain", "data_share"),
                   "monitor_img_s": _median(rs, "monitor", "img_s"),
                   "monitor_data_share": _median(rs, "monitor", "data_share"),
                   "verdicts": sorted({r["monitor"]["verdict"] for r in rs})} for f, rs in by.items()}
    peer = summary.get(PEER, {})
    for v in summary.values():
        v["vs_imagefolder"] = {"plain": _ratio(v["plain_img_s"], peer.get("plain_img_s")),
                               "monitor": _ratio(v["monitor_img_s"], peer.get("monitor_img_s"))}
    skipped = [why for f in ctx.grid["feeder"] if (why := skip({"model": model, "feeder": f}, ctx))]
    device = next((r["device"] for rs in by.values() for r in rs), "cpu")
    title = (f"train_step {model}: batch {s.batch}, {s.image} px, "
             + ("bf16 autocast, channels_last, " if cuda else f"fp32, {ctx.args.threads} thread(s), ")
             + f"SGD; {device}, {ctx.env.get('cores', cpu_count())} cores; {s.images} images "
               f"({-(-s.images // s.batch)} steps an epoch)")
    tuned = ctx.data.get("tune_result")
    tune = _tune_figures(tuned) if tuned else None
    _print_table(title, s, by, summary, skipped, cuda, tune)
    return {"title": title, "env": ctx.env, "model": model, "batch": s.batch, "image_size": s.image,
            "window": [s.start, s.end], "images": s.images, "device": device, "summary": summary,
            "rows": [{"feeder": pt["feeder"], "round": pt["round"], **row} for pt, row in rows],
            "skipped": skipped, "data": {k: str(v) for k, v in ctx.data.items()},
            "tune": tune, **({"autotune": extra["autotune"]} if extra else {})}


def _converge_report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    model = rows[0][0]["model"]
    s = shape_of(model, ctx.args)
    device = rows[0][1]["device"]
    title = (f"train_step {model}: batch {s.batch}, {s.image} px; {device}, {ctx.env.get('cores', cpu_count())} "
             f"cores; {s.images} images ({-(-s.images // s.batch)} steps an epoch)")
    return {"title": title, "env": ctx.env, "model": model, "batch": s.batch, "image_size": s.image,
            "images": s.images, "device": device, "autotune": print_converge(title, rows)}


def _tune_figures(path: Path) -> dict[str, Any]:
    import json

    got = json.loads(Path(path).read_text())
    trials = [{"num_workers": t.get("num_workers"), "prefetch_factor": t.get("prefetch_factor"),
               "img_s": (t.get("measurement") or {}).get("samples_per_s")} for t in got["trials"]]
    return {"chosen": got["chosen"], "reason": got["reason"], "wall_s": got.get("wall_s"),
            "stored_at": got["stored_at"], "trials": trials, "step_time": got.get("step_time")}


def _print_table(title: str, s: Shape, by: dict[str, list[dict[str, Any]]], summary: dict[str, Any],
                 skipped: list[str], cuda: bool, tune: dict[str, Any] | None) -> None:
    sync = "the training stream synchronised after each step" if cuda else "host clock"
    print(f"\n== {title}")
    print(f"   plain: steps {s.start}-{s.end - 1} timed ({sync}); monitor: the next {s.steps} under "
          f"fastfeed.StepMonitor ({'CUDA events, no per-step sync' if cuda else 'host clock'})")
    print(f"{'feeder':<16}{'plain img/s':>12}{'data wait':>11}{'monitor img/s':>15}{'data wait':>11}  "
          f"{'verdict':<20}{'vs ' + PEER + ' (plain / mon.)':>30}")
    for f, v in summary.items():
        r = v["vs_imagefolder"]
        ratio = "-" if r["plain"] is None else f"{r['plain']:.2f}x / {r['monitor']:.2f}x"
        print(f"{f:<16}{fmt_rate(v['plain_img_s']):>12}{pct(v['plain_data_share']):>11}"
              f"{fmt_rate(v['monitor_img_s']):>15}{pct(v['monitor_data_share']):>11}  "
              f"{', '.join(v['verdicts']):<20}{ratio:>30}")
    for f, rs in by.items():
        r = rs[-1]
        p, m = r["plain"], r["monitor"]
        print(f"  {f}: {r['what']}" + (f" (below: its last of {len(rs)} rounds)" if len(rs) > 1 else ""))
        print(f"    plain: {p['epoch_starts']} epoch start(s) in its steps, data wait "
              f"{pct(p['data_share_within_epochs'])} without them; median step {p['step_ms_median']:.1f} ms, "
              f"median wait {p['wait_ms_median']:.2f} ms; first batch after {r['first_batch_s']:.1f} s")
        shares = ", ".join(f"{k} {v:.1%}" for k, v in m["shares"].items())
        print(f"    monitor: {m['epoch_starts']} epoch start(s); {shares}; {m['title']}")
        if m["verdict"] != "compute-bound":
            print(f"      fix: {m['fix']}")
        for note in r["notes"] + [n for n in m["notes"] if not n.startswith("the first step")]:  # ours: one extra
            print(f"    note: {note}")
    if tune is not None:
        c = tune["chosen"]
        beside = (f"beside a {tune['step_time']:g} s stand-in step" if tune.get("step_time") else "the loader alone")
        print(f"  fastfeed.tune ({beside}, {tune['wall_s']:.0f} s): num_workers={c.get('num_workers')}, "
              f"prefetch_factor={c.get('prefetch_factor')} at {fmt_rate(c['samples_per_s'])} img/s; {tune['reason']}")
        print("    its trials (workers:prefetch img/s): " + ", ".join(
            f"{t['num_workers']}:{t['prefetch_factor'] or '-'} {fmt_rate(t['img_s']) if t['img_s'] else '-'}"
            for t in tune["trials"]))
    if PEER not in summary:
        print(f"  no {PEER} in this run: no ratios")
    for why in skipped:
        print(f"  {why}")


BENCHMARK = Benchmark(
    name="train_step", doc=__doc__, options=options, prepare=prepare, skip=skip, run_point=run_point,
    report=report, report_by="model", progress=progress, isolate=True,
    grid=(Axis("model", ("resnet18", "resnet50"), choices=MODELS, flag="--model",
               help="torchvision ResNets on the GPU; cnn: the small CPU model"),
          REPEAT,
          Axis("feeder", FEEDERS, choices=(*FEEDERS, AUTOTUNE), flag="--feeders",
               help="what feeds the step; autotune: the convergence run (only when named)")),
    quick={"model": ("cnn",), "tune_budget": "15s"},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
