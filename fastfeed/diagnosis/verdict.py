"""From measured stages to findings: which stage limits the pipeline, against what demand, and the fix.

The limiting stage comes from the loader's own timings (:mod:`fastfeed.loading.bottleneck`: its
workers busy reading, busy decoding, idle, or absent with ``num_workers=0``), checked
against the stages measured on their own: storage that must be read cold every epoch
(remote shards without ``cache_dir``, or a dataset larger than half the memory) limits
when it is slower than the loader; "decode" with fewer workers than cores, while decode
on all cores would be 25% faster, is "workers". When decode limits, the fixes include storing
pixels instead of JPEGs (``pack --store raw``, or ``mixed:P`` when only part fits on the disk),
with the disk it would take (from the images' mean pixels) and the storage rate the loader would
then need.

The verdict then compares what the pipeline delivers with the demand (samples/s of one
rank's training step): at least 10% headroom is "not input-bound"; with ``num_workers=0``
the loading time adds to every step, so it is input-bound whenever that costs 5% of the
step or more. Unequal or padded batches (lengths in the index, :func:`fastfeed.balance_report`)
waste compute whatever the input pipeline does: they lead the report when the input is
not the problem.

Example:
    >>> findings, limiting, deliverable, input_bound, headroom = conclude(facts)   # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from fastfeed._util import format_bytes
from fastfeed.decode import roi
from fastfeed.decode.image import turbo_available
from fastfeed.diagnosis.probes import ImageStats
from fastfeed.diagnosis.report import Finding, Stage
from fastfeed.diagnosis.vocabulary import stage_label
from fastfeed.loading.bottleneck import INPUT_BOUND, LoadProfile, diagnose

__all__ = ["Facts", "conclude"]

#: Headroom under which the pipeline counts as input-bound (deliverable < demand x 1.1).
MARGIN = 0.10
#: "decode" becomes "workers" when decode on all cores beats the loader by this factor.
MORE_WORKERS = 1.25
#: Below this many timed batches the workers' idle share is noise (batches in flight at the ends).
FEW_BATCHES = 4
#: Images per CPU-second of the raw-pixel path over the JPEG path (RandomResizedCrop 224), as measured by
#: ``benchmarks/loader_raw.py`` (benchmarks/RESULTS.md, "Raw-pixel shards"); used to predict the raw rate.
RAW_GAIN = 2.5
#: The disk a raw copy may take: at most this share of the free space.
DISK_SHARE = 0.8


@dataclass(frozen=True)
class Facts:
    """Everything the verdict is drawn from (assembled by :func:`fastfeed.doctor`)."""

    path: str
    batch_size: int
    image_size: tuple[int, int] | None
    decode: str | None
    num_workers: int
    prefetch_factor: int | None
    workers_from: str
    cores_per_rank: int
    local_ranks: int
    remote: bool
    cache_dir: str | None
    fits_in_memory: bool
    demand: float | None
    step_time: float | None
    stages: dict[str, Stage]
    profile: LoadProfile | None
    images: ImageStats | None
    balance: Any  # BalanceReport | None
    dali_skipped: str | None
    load_average: float | None = None
    small_dataset: str | None = None  # the batch is larger than the dataset per rank (the warning)
    num_samples: int = 0
    stored_raw: bool = False  # the dataset stores pixels already (pack --store raw|mixed:P)
    disk_free: int | None = None  # free bytes where the dataset is (None: remote or unknown)

    def rate(self, key: str) -> float | None:
        s = self.stages.get(key)
        return None if s is None or s.skipped else s.samples_per_s

    @property
    def storage_every_epoch(self) -> bool:
        """Storage is read cold every epoch: remote without cache, or too big for the page cache."""
        return (self.remote and self.cache_dir is None) or (not self.remote and not self.fits_in_memory)

    def tune_command(self) -> str:
        size = self.image_size
        opts = f" --image-size {size[0]}" if size and size[0] == size[1] else ""
        opts += " --image-size none" if size is None and self.images is not None else ""  # not tune's default
        opts += f" --decode {self.decode or 'none'}" if self.decode != "cpu" else ""
        opts += f" --target-rate {self.demand:.0f}" if self.demand else ""
        return f"fastfeed tune {self.path} --batch-size {self.batch_size}{opts}"


def _n(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f}"


def _unmeasured(f: Facts) -> str:
    """Why the CPU decode stages were skipped, in words ('' when they ran)."""
    s = f.stages.get("decode_core")
    return f" (CPU decode not measured: {s.skipped})" if s is not None and s.skipped else ""


def _all_cores(f: Facts) -> str:
    """Where "decode on all cores" ran, in words: 'all N core(s)', or the host's cores and the ranks sharing them."""
    if f.local_ranks > 1:
        return f"the host's {f.cores_per_rank * f.local_ranks} cores (per rank, {f.local_ranks} ranks sharing them)"
    return f"all {f.cores_per_rank} core(s)"


def _decode_all(f: Facts) -> str:
    """', decode on all N cores X' when it was measured, else ''."""
    all_ = f.rate("decode_all")
    return "" if all_ is None else f", decode on {_all_cores(f)} {all_:,.0f}"


def _delivers(deliverable: float) -> str:
    return f"the pipeline delivers {deliverable:,.0f} samples/s per rank"


def _differs(f: Facts, kind: str, deliverable: float) -> str:
    """Why the verdict's figure is not the loader row's, as the why's first words ('' when it is).

    The figure is always a row of the table: the loader's, or a stage the loader measured alone
    does not feel (storage read cold every epoch; decode on cores the host's ranks share).
    """
    loader = f.rate("loader")
    if loader is None or abs(deliverable - loader) <= 0.005 * max(loader, 1.0):
        return ""
    head = f"{deliverable:,.0f} samples/s per rank is the {{row}} row's figure, not the loader row's {loader:,.0f}: "
    if kind == "storage" and deliverable == f.rate("storage"):
        return head.format(row="storage") + "the shards are read cold every epoch, the loader read them warm; "
    if deliverable == f.rate("decode_all") and f.local_ranks > 1:
        return (head.format(row="decode") + f"the host's {f.cores_per_rank * f.local_ranks} cores are shared by its "
                f"{f.local_ranks} ranks, the loader was measured with the host to itself; ")
    return ""


def _measured_apart(f: Facts) -> str:
    """Why decode on all cores came out below the loader, which decodes on the same cores ('' when it did not)."""
    all_, loader = f.rate("decode_all"), f.rate("loader")
    if all_ is None or not loader or f.local_ranks > 1 or all_ >= 0.95 * loader:
        return ""
    st = f.stages.get("decode_all")
    per_cpu = st.figures.get("per_cpu_second") if st is not None else None
    return (f"; decode was measured apart, at another moment, and came out below the loader: the cores were "
            "busier then" + (f" (per CPU-second it decodes {per_cpu:,.0f})" if per_cpu else ""))


# ---------------------------------------------------------------------- the limiting stage
def limiting_stage(f: Facts) -> tuple[str, float]:
    """(kind, samples/s the pipeline delivers to one rank) — see the module docstring."""
    loader = f.rate("loader") or 0.0
    storage = f.rate("storage")
    decode_all = f.rate("decode_all")
    deliverable = loader
    if f.local_ranks > 1 and decode_all is not None and f.decode == "cpu":
        deliverable = min(deliverable, decode_all)  # the host's cores are shared by its ranks
    if storage is not None and f.storage_every_epoch and storage < deliverable:
        return "storage", storage
    if f.profile is None or f.profile.batches == 0:  # DALI: no worker timings
        return ("storage" if storage is not None and storage < 1.2 * loader else "decode"), deliverable
    kind = diagnose(replace(f.profile, wait_fraction=1.0)).kind  # the doctor's loop only waits
    if kind == "transfer" and f.profile.batches < FEW_BATCHES:  # idle time is not measurable from so few
        kind = "storage" if f.profile.read_share >= 0.5 else "decode"
    if kind == "decode" and _more_workers_help(f) and (not f.demand or decode_all >= f.demand * (1 + MARGIN)):
        kind = "workers"  # more workers reach the demand (or, without one, go faster): the setting limits
    if kind == "transfer" and decode_all and loader >= 0.8 * decode_all:
        kind = "decode"
    if f.small_dataset and kind in ("workers", "transfer"):  # one partial batch per epoch: no setting overlaps it
        kind = "storage" if f.profile.read_share >= 0.5 else "decode"
    return kind, deliverable


def _more_workers_help(f: Facts) -> bool:
    """Fewer workers than cores, and decode on all cores is clearly faster than the loader."""
    loader, decode_all = f.rate("loader") or 0.0, f.rate("decode_all")
    return f.num_workers < f.cores_per_rank and decode_all is not None and decode_all > MORE_WORKERS * loader


def _label(kind: str, f: Facts) -> str:
    return stage_label(kind, f.num_workers)  # the words the step monitor uses too


# ---------------------------------------------------------------------- why and fix, per kind
def _busy(f: Facts) -> str:
    p = f.profile
    if p is None or p.batches == 0:
        return ""
    who = "the training process" if f.num_workers == 0 else f"its {f.num_workers} worker(s)"
    return (f"; {who} spent {p.busy:.0%} of the time on batches, {p.read_share:.0%} of it reading and "
            f"{1 - p.read_share:.0%} decoding")


def _storage(f: Facts) -> tuple[str, str]:
    st = f.stages.get("storage")
    fig = st.figures if st is not None else {}
    why = f"storage delivers {_n(f.rate('storage'))} samples/s ({st.detail if st else 'not measured'})"
    why += f"{_decode_all(f)}, the loader {_n(f.rate('loader'))}{_busy(f)}"
    fixes = []
    if f.remote and f.cache_dir is None:
        fixes.append("pass cache_dir='/local/disk/cache' to loader(): each shard is downloaded once per host "
                     "(without it, every worker downloads the shards it reads, every epoch) and later epochs read "
                     "local disk")
    latency, mb_s, shard = fig.get("latency_ms"), fig.get("mb_per_s"), fig.get("shard_bytes", 0)
    if latency and mb_s and shard < 64e6 and latency / 1e3 > 0.25 * shard / (mb_s * 1e6):
        fixes.append(f"requests are small for their latency ({latency:,.0f} ms each, {format_bytes(shard)} shards): "
                     "re-pack with larger shards (`fastfeed pack ... --shard-size 256MB`)")
    if f.profile is not None and f.profile.batches and f.profile.cpu_share < 0.5:
        fixes.append(f"raise num_workers beyond the cores (e.g. {max(2, 2 * f.num_workers)}): workers waiting "
                     f"on storage use no CPU (they used {f.profile.cpu_share:.0%} of a core while reading)")
    if not f.remote and not f.fits_in_memory:
        fixes.append("the dataset does not fit in the page cache, so every epoch reads the disk: copy the shards "
                     "to faster local storage (NVMe)")
    if not fixes:
        fixes.append("faster storage, or a local copy of the shards")
    return why, "; ".join(fixes)


def _max_side_target(f: Facts) -> int | None:
    """The ``pack --max-side`` worth suggesting (images 1.5x larger than twice the output), or None."""
    img, size = f.images, f.image_size
    if img is None or size is None:
        return None
    target = int(math.ceil(max(256, 2 * max(size)) / 64) * 64)
    return target if img.longer_side >= 1.5 * target else None


def _max_side(f: Facts) -> str | None:
    img, size, target = f.images, f.image_size, _max_side_target(f)
    if img is None or size is None or target is None:
        return None
    scale = target / img.longer_side
    return (f"store smaller images: `fastfeed pack SRC DST --max-side {target}` (they average "
            f"{img.mean_width:,.0f}x{img.mean_height:,.0f}, {img.megapixels:.1f} MP, for {size[1]}x{size[0]} "
            f"output: ~{1 / scale ** 2:.0f}x fewer pixels to decode)")


def _restarts(f: Facts) -> str | None:
    """``pack --jpeg-restarts`` when most images are plain JPEGs and the CPU path crops them."""
    img = f.images
    if img is None or img.plain_jpeg_share < 0.5 or f.image_size is None or f.decode not in ("cpu", None):
        return None

    if not (roi.built() and turbo_available()):  # pack needs the extension, cropping simplejpeg + OpenCV
        return None
    return ("re-pack with `fastfeed pack SRC DST --jpeg-restarts` (its default where fastfeed's C extension is "
            "built; these JPEGs have no restart markers): the same pixels, losslessly re-coded so each "
            "random crop decodes only its blocks (~1.4x images per CPU-second for RandomResizedCrop on "
            "ImageNet-sized JPEGs)")


def _raw_store(f: Facts) -> str | None:
    """``pack --store raw`` (or ``mixed:P``) when the CPU crops images and the disk has room for the pixels."""
    img = f.images
    if img is None or f.image_size is None or f.decode != "cpu" or f.stored_raw or not f.num_samples:
        return None
    side = _max_side_target(f)  # pixels as they would be stored with that --max-side
    scale = 1.0 if side is None else side / img.longer_side
    w, h = img.mean_width * scale, img.mean_height * scale
    per_image = 3 * w * h
    need = per_image * f.num_samples
    cmd = "fastfeed pack SRC DST" + (f" --max-side {side}" if side else "")
    room = None if f.disk_free is None else DISK_SHARE * f.disk_free
    core = f.rate("decode_core")
    rate = f.demand or (RAW_GAIN * f.rate("decode_all") if f.rate("decode_all") else None)
    storage = "" if rate is None else (
        f"; at {rate:,.0f} images/s the storage must then deliver ~{rate * per_image / 1e6:,.0f} MB/s "
        "(when the shards do not stay in the page cache)")
    gain = (f"~{RAW_GAIN:g}x the images per CPU-second (benchmarks/RESULTS.md, loader_raw)"
            + (f", ~{RAW_GAIN * core:,.0f}/s per core" if core else ""))
    disk = (f"~{format_bytes(need)} of disk for {f.num_samples:,} images of ~{w:,.0f}x{h:,.0f} "
            f"({format_bytes(per_image)} each, {format_bytes(img.mean_bytes)} as JPEG now)")
    if room is None or need <= room:
        where = "" if room is None else f", {format_bytes(f.disk_free or 0)} free there"
        return (f"trade disk for CPU: `{cmd} --store raw` stores pixels, so loading crops without "
                f"decoding ({gain}); it takes {disk}{where}{storage}")
    share = math.floor(10 * room / need) / 10
    if share < 0.2:
        return None
    return (f"trade some disk for CPU: `{cmd} --store mixed:{share:g}` stores the {share:.0%} smallest images as "
            f"pixels, which crop without decoding (all of them would take {disk}, more than the "
            f"{format_bytes(f.disk_free or 0)} free there)")


def _decode(f: Facts) -> tuple[str, str]:
    core, all_ = f.rate("decode_core"), f.rate("decode_all")
    if all_ is not None:
        why = (f"decode + augmentation reaches {all_:,.0f} samples/s on {_all_cores(f)}"
               + (f" ({core:,.0f} per core)" if core is not None else "") + ", ")
    else:  # DALI (or raw bytes): the loader's figure is the decode figure
        what = "the DALI loader (GPU decode)" if f.decode == "dali" else "the loader"
        why = f"{what} delivers {_n(f.rate('loader'))} samples/s{_unmeasured(f)}, "
    why += f"storage {_n(f.rate('storage'))}"
    why += f"; the loader delivers {_n(f.rate('loader'))}{_busy(f)}" if all_ is not None else _busy(f)
    why += _measured_apart(f)
    fixes = []
    if _more_workers_help(f):
        fixes.append(f"use all {f.cores_per_rank} cores: num_workers={f.num_workers} reaches {_n(f.rate('loader'))}, "
                     f"all cores {_n(all_)} samples/s (`{f.tune_command()}`)")
    dali = f.rate("dali")
    if f.decode == "dali":
        fixes.append(f"tune the DALI pipeline (its threads and queue depth): `{f.tune_command()}`")
    elif dali is not None:
        fixes.append(f"decode on the GPU: loader(..., decode='dali') delivered {dali:,.0f} samples/s here")
    elif f.image_size is not None:
        fixes.append(f"decode on the GPU with loader(..., decode='dali') (not measured here: {f.dali_skipped})")
    smaller = _max_side(f)
    if smaller:
        fixes.append(smaller)
    restarts = _restarts(f)
    if restarts:
        fixes.append(restarts)
    raw = _raw_store(f)
    if raw:
        fixes.append(raw)
    if f.demand and core:
        fixes.append(f"on the CPU, {f.demand:,.0f} samples/s needs ~{math.ceil(f.demand / core)} cores at "
                     f"{core:,.0f} per core; this host has {f.cores_per_rank} per rank")
    if not fixes:
        fixes.append("a cheaper transform, or more CPU cores per rank")
    return why, "; ".join(fixes)


def _workers(f: Facts) -> tuple[str, str]:
    loader, all_, core = f.rate("loader"), f.rate("decode_all"), f.rate("decode_core")
    if f.num_workers == 0:
        per_batch = f.batch_size / loader if loader else float("nan")
        why = (f"num_workers=0: each batch is read and decoded inside the training process, after the step "
               f"and not during it ({per_batch * 1e3:,.0f} ms per batch of {f.batch_size}, {_n(loader)} "
               f"samples/s)" + (f"; decode on {_all_cores(f)} reaches {_n(all_)}" if all_ else "")
               + _busy(f))
        want = max(1, f.cores_per_rank - 1)
        if f.demand and core:
            want = max(1, min(want, math.ceil(f.demand * (1 + MARGIN) / core)))
        fix = (f"set num_workers={want} so loading overlaps the step, or num_workers='auto' after "
               f"`{f.tune_command()}`")
        return why, fix
    why = (f"{f.num_workers} worker(s) deliver {_n(loader)} samples/s"
           + (f"; decode on {_all_cores(f)} reaches {all_:,.0f}" if all_ is not None else "")
           + _busy(f))
    origin = {"heuristic": " (the heuristic default: nothing was tuned)", "tuned": " (as tuned; re-tune)"}
    fix = (f"raise num_workers{origin.get(f.workers_from, '')}: `{f.tune_command()}` measures and stores the "
           "best setting, which loader(num_workers='auto') then uses")
    return why, fix


def _transfer(f: Facts) -> tuple[str, str]:
    all_ = f.rate("decode_all")
    why = (f"the loader delivers {_n(f.rate('loader'))} samples/s while "
           + (f"decode on all cores reaches {all_:,.0f} and " if all_ is not None else "")
           + f"storage {_n(f.rate('storage'))}{_busy(f)}")
    loader = f.stages.get("loader")
    main_cpu = loader.figures.get("main_cpu_share") if loader is not None else None
    if main_cpu is not None and main_cpu >= 0.8:
        why += f"; the training process itself used {main_cpu:.0%} of a core just receiving the batches"
        fix = ("the training process is busy receiving batches (each one is pickled across processes, except its "
               "tensors): return tensors rather than lists of Python objects (a transform that tokenizes into "
               f"arrays), or larger batches to spread the per-batch cost; `{f.tune_command()}` measures the "
               "setting")
        return why, fix
    fix = ("batches are held up between the workers and the loop: raise prefetch_factor (`"
           f"{f.tune_command()}` searches it), leave a core to the training process, and keep the per-batch "
           "work of the loop (transfers, Python) small")
    if f.load_average is not None and f.load_average > 1.5 * f.cores_per_rank * f.local_ranks:
        fix += ("; on this busy machine the workers and the loop may both have been waiting for a core, so "
                "diagnose again when it is idle")
    return why, fix


_EXPLAIN = {"storage": _storage, "decode": _decode, "workers": _workers, "transfer": _transfer,
            "input-bound": _decode}


# ---------------------------------------------------------------------- findings
def _step_wait(f: Facts) -> str:
    s = f.stages.get("loader_step")
    if s is None or s.skipped or s.figures.get("wait_fraction") is None:
        return ""
    return (f"; with a {s.figures['step_time']:.3g} s training step simulated, the loop waited "
            f"{s.figures['wait_fraction']:.0%} of step time (loader.stats)")


def _balance(f: Facts) -> Finding | None:
    r = f.balance
    if r is None:
        return None
    ff, base = r.rows[0], r.rows[1]
    speedup = r.speedup()
    if not (base.padding_efficiency < 0.9 or base.straggler_ratio > 1.1) or not speedup >= 1.05:
        return None
    title = (f"padding and stragglers: DistributedSampler + batch {r.settings['baseline_batch_size']} "
             f"spends {1 - base.padding_efficiency:.0%} of its tokens on padding, and each step waits for a "
             f"slowest rank {base.straggler_ratio:.2f}x the mean")
    why = (f"{r.num_samples:,} lengths over world size {r.world_size}: padding efficiency "
           f"{base.padding_efficiency:.2f} (DistributedSampler) vs {ff.padding_efficiency:.2f} ({ff.name}); "
           f"straggler ratio {base.straggler_ratio:.2f} vs {ff.straggler_ratio:.2f}; ranks wait "
           f"{base.wait_share:.0%} vs {ff.wait_share:.0%} of their time for the slowest")
    fix = (f"batch by length: DataLoader(fastfeed.open_dataset(...), batch_sampler=fastfeed."
           f"DistributedLengthBucketSampler(lengths, batch_size={f.batch_size})) with the lengths from the index; "
           f"predicted {speedup:.2f}x real tokens per second (DistributedTokenBudgetSampler for a token budget "
           f"per batch; `fastfeed balance {f.path} --world-size {r.world_size} --batch-size {f.batch_size}`)")
    return Finding("balance", title, why, fix)


def _extras(f: Facts, kind: str) -> list[Finding]:
    out = []
    loader, storage = f.rate("loader"), f.rate("storage")
    if f.num_workers == 0 and kind != "workers" and f.decode != "dali" and not f.small_dataset:
        why, fix = _workers(f)
        out.append(Finding("workers", "num_workers=0: loading runs inside the training process", why, fix))
    if f.remote and f.cache_dir is None and kind != "storage":
        out.append(Finding("remote-cache", "remote shards without cache_dir: every epoch downloads them again",
                           f"storage delivers {_n(storage)} samples/s from {f.path}",
                           "pass cache_dir= to loader() (a bounded local cache shared by the host's ranks)"))
    if storage is not None and loader and storage < loader and not f.storage_every_epoch:
        where = "local disk after the first download" if f.remote else "the page cache"
        out.append(Finding("cold-start", f"the first epoch is storage-bound at {_n(storage)} samples/s",
                           f"cold storage delivers {_n(storage)} samples/s, the loader {_n(loader)} from warm data",
                           f"nothing to do for later epochs (they read {where}); a faster first epoch needs "
                           "faster storage"))
    cores = f.cores_per_rank * f.local_ranks
    if f.load_average is not None and f.load_average > 1.5 * cores:
        per_cpu = (f.stages["decode_core"].figures.get("per_cpu_second") if "decode_core" in f.stages else None)
        out.append(Finding(
            "busy-host", f"the machine was busy: load average {f.load_average:.1f} on {cores} core(s) before the "
                         "doctor started",
            "other processes shared the cores, so the CPU-bound figures (decode, loader) are lower than on an "
            "idle machine" + (f"; one dedicated core decodes ~{per_cpu:,.0f} samples/s (per CPU-second)"
                              if per_cpu else ""),
            "diagnose again while the machine is otherwise idle, or keep other work off the training cores"))
    src = f.stages.get("source")
    if src is not None and not src.skipped and src.samples_per_s and storage:
        ratio = storage / src.samples_per_s
        title = (f"what packing bought: the packed shards read {ratio:,.1f}x faster than the raw files"
                 if ratio >= 1.5 else
                 f"packing gains little on this storage: the packed shards read {ratio:,.1f}x as fast as the raw "
                 "files")
        fix = "nothing to do: you already read the packed shards"
        if f.demand and src.samples_per_s < f.demand:
            fix += (f" (the raw files, read at random, would deliver {src.samples_per_s:,.0f} samples/s, "
                    f"below the {f.demand:,.0f} training needs)")
        elif ratio < 1.5:
            fix += "; packing still saves file-system metadata work and gives the loader whole shards to cache"
        out.append(Finding("packing", title, f"raw files: {src.detail}; packed shards: {_n(storage)} samples/s",
                           fix))
    return out


def _small_dataset(f: Facts) -> Finding | None:
    """The batch is larger than the dataset per rank: the one thing to do first (None when it is not)."""
    if not f.small_dataset:
        return None
    head, _, fix = f.small_dataset.partition(". ")
    title, _, why = head.partition(": ")
    return Finding("small-dataset", title, why, fix + ", then diagnose again: these figures are for one partial "
                   "batch per epoch, and until then no worker setting helps (tune stores num_workers=0 for it)")


def _no_worker_advice(main: Finding) -> Finding:
    """With one partial batch per epoch no worker can prepare a batch ahead: the worker fix gives way to the
    small-dataset finding, which leads the report."""
    if main.kind != "workers":
        return main
    return replace(main, fix="none from the worker setting: every epoch is one partial batch, which no worker can "
                             "prepare ahead, so num_workers=0 is right for this data (see the first finding)")


def _against_demand(f: Facts, kind: str, deliverable: float) -> tuple[Finding, str, bool]:
    """The main finding with a demand: (finding, limiting kind, input-bound)."""
    demand = f.demand or 1.0
    headroom = deliverable / demand
    label = _label(kind, f)
    why, fix = _EXPLAIN.get(kind, _decode)(f)
    step = f.stages.get("loader_step")
    waited = step.figures.get("wait_fraction") if step is not None and not step.skipped else None
    serial = None  # with num_workers=0 the loading time adds to every step: the share it takes
    if f.num_workers == 0 and f.decode != "dali" and deliverable > 0:
        load_t, step_t = f.batch_size / deliverable, f.batch_size / demand
        serial = waited if waited is not None else load_t / (load_t + step_t)
    if serial is not None and serial >= INPUT_BOUND and f.small_dataset:  # no worker can overlap it
        title = (f"input-bound, limited by {label}: every step waits ~{serial:.0%} of its time for its batch, "
                 f"one partial batch per epoch ({_delivers(deliverable)}, training consumes "
                 f"{demand:,.0f})")
        return Finding(kind, title, why + _step_wait(f), fix), kind, True
    if serial is not None and serial >= INPUT_BOUND:
        why, fix = _workers(f)
        title = (f"input-bound, limited by {_label('workers', f)}: every step waits ~{serial:.0%} of its time for "
                 f"its batch ({_delivers(deliverable)}, training consumes {demand:,.0f})")
        return Finding("workers", title, why + _step_wait(f), fix), "workers", True
    if headroom < 1 + MARGIN:
        title = (f"input-bound, limited by {label}: {_delivers(deliverable)}, "
                 f"training consumes {demand:,.0f} ({headroom:.2f}x"
                 + (f", short by {1 - headroom:.0%})" if headroom < 1 else ")"))
        return Finding(kind, title, why + _step_wait(f), fix), kind, True
    advice = "nothing to fix in the input pipeline: look at the training step itself (model, kernels, communication)."
    core = f.rate("decode_core")
    if core and f.num_workers > 1 and f.decode == "cpu":
        workers = math.ceil(demand * (1 + MARGIN) / core)
        if workers < f.num_workers:
            advice += (f" The input needs ~{workers} of the {f.num_workers} workers: `{f.tune_command()}` picks the "
                       "cheapest setting that keeps up and leaves the other cores to training.")
    if waited is not None and waited >= 2 * INPUT_BOUND:
        advice += (f" The simulated run still waited {waited:.0%} of step time: batches arrive in bursts (epoch "
                   "starts, slow batches); a larger prefetch_factor smooths them.")
    title = (f"not input-bound: {_delivers(deliverable)}, training consumes "
             f"{demand:,.0f} ({headroom:.1f}x headroom)")
    return Finding("not-input-bound", title, f"the slowest input stage is {label}: {why}{_step_wait(f)}",
                   advice), kind, False


def conclude(f: Facts) -> tuple[tuple[Finding, ...], str, float, bool | None, float | None]:
    """(findings with the verdict first, limiting kind, deliverable samples/s, input-bound, headroom)."""
    kind, deliverable = limiting_stage(f)
    limit = kind
    input_bound: bool | None = None
    headroom: float | None = None
    if f.demand:
        headroom = deliverable / f.demand
        main, kind, input_bound = _against_demand(f, kind, deliverable)
    else:
        why, fix = _EXPLAIN.get(kind, _decode)(f)
        main = Finding(kind, f"{_delivers(deliverable)}, limited by "
                             f"{_label(kind, f)} (no demand given: pass --target-rate or --step-time to compare "
                             "with training)", why, fix)
    differs = _differs(f, limit, deliverable)
    if differs:  # the title's figure is a row of the table: which one, when not the loader's
        main = replace(main, why=differs + main.why)
    findings = [main]
    balance = _balance(f)
    if balance is not None:  # wasted compute whatever the input does: first unless the input binds
        findings.insert(1 if input_bound else 0, balance)
    small = _small_dataset(f)
    if small is not None:  # the figures describe one partial batch per epoch: fix that first
        findings = [small] + [_no_worker_advice(x) for x in findings]
    findings += _extras(f, kind)
    return tuple(findings), kind, deliverable, input_bound, headroom
