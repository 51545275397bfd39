"""The ``fastfeed`` command: a thin argparse layer over the public functions.

Each subcommand has an ``_add_<command>(sub)`` that declares its arguments and a
``_run_<command>(args) -> int`` that calls the library and prints. Exit codes (also in
``fastfeed --help``): 0 ok; 1 the check found problems (``verify``, ``doctor
--fail-if-input-bound``); 2 a usage error (bad arguments, or a
:class:`~fastfeed.errors.FastfeedError` from the library: one line on stderr); 3 an
unexpected internal error (one line, ``-v`` shows the traceback); 130 interrupted.
Progress goes to stderr: a bar on a terminal, else a line every
:data:`fastfeed._progress.PROGRESS_EVERY` seconds (batch jobs have no terminal).

Example:
    >>> from fastfeed.cli import main
    >>> main(["--version"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Callable, Sequence

from fastfeed import __version__
from fastfeed._progress import PackProgress, Progress
from fastfeed.errors import FastfeedError

__all__ = ["EXIT_INTERNAL", "EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "build_parser", "main"]

Runner = Callable[[argparse.Namespace], int]

#: Exit codes: ok; problems found (verify, doctor --fail-if-input-bound); usage error; internal error.
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3

_EPILOG = """exit codes:
  0    ok
  1    the check found problems: verify found damage; doctor --fail-if-input-bound found the input bound
  2    usage error: bad arguments, or an error fastfeed explains (what, where, how to fix)
  3    unexpected internal error (a bug): run again with -v for the traceback
  130  interrupted

Progress goes to stderr: a bar on a terminal, else a line every 30 s (SLURM and CI logs).
-v works before or after the command."""


# ---------------------------------------------------------------- pack / info / verify
# (section owned by the pack issue)
_PACK_HELP = "pack small files (ImageFolder, files by key, JSONL) into tar or LMDB shards + an index"
_INFO_HELP = "summarise a packed dataset"
_VERIFY_HELP = "check a packed dataset: checksums, every sample readable, every image decodable"


def _add_pack(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", metavar="SRC", help="an ImageFolder, a folder of files grouped by key, a JSONL manifest, "
                   "a .parquet file (or a folder or quoted glob of them), or a datasets save_to_disk folder")
    p.add_argument("dst", metavar="DST", help="output folder (created; must not be inside SRC), or an "
                   "object-store URL such as s3://bucket/prefix")
    p.add_argument("--input", choices=["auto", "imagefolder", "files", "jsonl", "parquet", "hf", "webdataset"],
                   default="auto", help="how to read SRC (default: detect; parquet: one sample per row; hf: a "
                   "Dataset.save_to_disk folder; webdataset: a folder of tars, converted member by member)")
    p.add_argument("--columns", default=None, metavar="COL=FIELD,...",
                   help="parquet/hf: the columns to pack and their fields, e.g. image=jpg,caption=txt "
                        "(default: every column, field by type)")
    p.add_argument("--key", default=None, metavar="COLUMN",
                   help="parquet/hf: the column holding each row's key (default: the row number)")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="a local tokenizers JSON file, or a folder holding tokenizer.json; with --tokenize "
                        "or --length (exact token counts)")
    p.add_argument("--tokenize", default=None, metavar="FIELD",
                   help="with --tokenizer: store the token ids of text FIELD (a column for parquet/hf) in "
                        "the field tokens.npy and their counts in lengths.npy")
    p.add_argument("--format", choices=["tar", "lmdb"], default="tar",
                   help="shard format: tar (WebDataset + DALI index) or lmdb (default tar)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--shard-size", default="256MB", metavar="SIZE",
                      help="target shard size, e.g. 256MB or 1GiB (default 256MB)")
    size.add_argument("--samples-per-shard", type=int, default=None, metavar="N",
                      help="at most N samples per shard (instead of --shard-size)")
    p.add_argument("--workers", default="auto", metavar="N",
                   help="processes writing shards (default auto: one per core)")
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True,
                   help="store samples in a seeded random order so shards mix classes (default on)")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    p.add_argument("--max-side", type=int, default=None, metavar="PX",
                   help="resize images whose longer side exceeds PX (re-encoded; with --store raw, the pixels "
                        "stored, resized with INTER_AREA)")
    p.add_argument("--store", default="jpeg", metavar="{jpeg,raw,mixed:P}",
                   help="jpeg: images as they are (default); raw: decode now and store uint8 pixels, so loading "
                        "does no decode (~10x the disk of ImageNet-sized JPEGs; bound it with --max-side); "
                        "mixed:P: the share P of images with the fewest pixels raw, the rest JPEG (e.g. mixed:0.5)")
    p.add_argument("--quality", type=int, default=90, metavar="Q",
                   help="JPEG/WebP quality for --max-side (default 90)")
    p.add_argument("--jpeg-restarts", action=argparse.BooleanOptionalAction, default=None,
                   help="store JPEGs losslessly with a restart marker per 16x16 block, so random crops "
                        "decode only their blocks (same pixels, different bytes; needs fastfeed's C extension). "
                        "Default: on when that extension is built; --no-jpeg-restarts keeps the source bytes")
    p.add_argument("--length", default=None, metavar="FIELD",
                   help="record per-sample lengths: a number field, a text field (whitespace tokens; with "
                        "--tokenizer: its exact token count), or FIELD:KEY inside a JSON field")
    p.add_argument("--on-error", choices=["raise", "skip", "fail"], default="raise", metavar="{raise,skip}",
                   help="bad input: stop with an error (raise, the default), or skip it and list it in "
                        "DST/skipped.txt ('fail' is the old spelling of raise)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace fastfeed's files in a non-empty DST")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: --workers processes on this machine (default); ray: one Ray task per "
                        "shard on a Ray cluster, same output (pip install 'fastfeed[ray]')")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --engine ray: the head node's HOST:PORT, auto, or ray://HOST:PORT "
                        "(default: RAY_ADDRESS, else a new local Ray)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _index_stamp(dst: str) -> Any:
    """What identifies DST's index.json now (None when there is none): unchanged = nothing was packed."""
    from fastfeed.packed.index import INDEX_NAME
    from fastfeed.storage.remote import filesystem, is_url

    try:
        if is_url(dst):
            fs, root = filesystem(dst)
            info = fs.info(f"{root.rstrip('/')}/{INDEX_NAME}")
            return tuple(sorted((str(k), str(v)) for k, v in info.items()))
        st = os.stat(os.path.join(dst, INDEX_NAME))
        return (st.st_ino, st.st_mtime_ns, st.st_size)
    except (OSError, ValueError, FastfeedError):
        return None


def _input_kind(idx: Any) -> str:
    """What the pack summary says it read: ``imagefolder, 1000 classes``, ``files``..."""
    if idx.classes is None:
        return str(idx.input)
    return f"{idx.input}, {len(idx.classes)} class{'es' if len(idx.classes) != 1 else ''}"


def _run_pack(args: argparse.Namespace) -> int:
    from fastfeed._util import format_bytes
    from fastfeed.errors import ConfigError
    from fastfeed.packing.api import pack

    workers: int | str = args.workers
    if workers != "auto":
        try:
            workers = int(workers)
        except ValueError:
            raise ConfigError(f"--workers {workers!r}: write a number or auto") from None
    if args.ray_address is not None and args.engine != "ray":
        raise ConfigError("--ray-address needs --engine ray")
    bar = PackProgress()
    ray_log = logging.getLogger("fastfeed.pack.ray")
    ray_level = ray_log.level
    if args.engine == "ray" and not bar.tty:
        ray_log.setLevel(logging.INFO)  # no terminal (a cluster job's log): the engine's shard lines too
    before = None if args.overwrite else _index_stamp(args.dst)
    try:
        idx = pack(
            args.src, args.dst, input=args.input, format=args.format, shard_size=args.shard_size,
            samples_per_shard=args.samples_per_shard, workers=workers, shuffle=args.shuffle,
            seed=args.seed, max_side=args.max_side, quality=args.quality, length=args.length,
            on_error=args.on_error, overwrite=args.overwrite, jpeg_restarts=args.jpeg_restarts, progress=bar,
            engine=args.engine, ray_address=args.ray_address, columns=args.columns, key=args.key,
            tokenizer=args.tokenizer, tokenize=args.tokenize, store=args.store,
        )
    finally:
        ray_log.setLevel(ray_level)
        bar.close()
    total = sum(s.bytes for s in idx.shards)
    done = before is not None and before == _index_stamp(args.dst)  # pack() found it complete
    tokens = int(idx.lengths.sum()) if idx.tokenizer is not None and idx.lengths is not None else None
    if args.json:
        import json

        print(json.dumps({"dst": args.dst, "already_complete": done, "num_samples": idx.num_samples,
                          "num_shards": len(idx.shards), "format": idx.format, "bytes": total,
                          "skipped": len(idx.skipped), "input": idx.input,
                          "classes": None if idx.classes is None else len(idx.classes),
                          **({"tokens": tokens} if tokens is not None else {})}, indent=1))
    elif done:
        print(f"already complete: {args.dst} holds these {idx.num_samples} samples in {len(idx.shards)} "
              f"{idx.format} shard(s), {format_bytes(total)}; nothing was packed (--overwrite packs again)")
    else:
        print(f"packed {idx.num_samples} samples into {len(idx.shards)} {idx.format} shard(s), "
              f"{format_bytes(total)}, in {args.dst} (input: {_input_kind(idx)})")
    if tokens is not None and not args.json:
        t = idx.tokenizer or {}
        print(f"{tokens} tokens of {t.get('field')} (vocabulary {t.get('vocab_size')}, "
              f"{t.get('dtype') if t.get('tokens') else 'counted only'}, pad id {t.get('pad_id')})")
    if idx.store is not None and not args.json:
        print(_store_line(idx.store, total))
    if idx.skipped and not args.json:
        print(f"skipped {len(idx.skipped)} input(s); see {args.dst}/skipped.txt")
    if not done and not args.json:
        print(f"check it before training (every shard read, every image decoded): fastfeed verify {args.dst}")
    return 0


def _store_line(store: Any, total: int) -> str:
    """``raw pixels (rgb8): 120 of 120 images, 41.2 MB on disk, ~4.3 MB as JPEG (9.6x)``."""
    from fastfeed._util import format_bytes

    as_jpeg = total - int(store.get("raw_bytes", 0)) + int(store.get("encoded_bytes", 0))
    what = "raw pixels" if store.get("mode") == "raw" else f"mixed (share {store.get('share')} as pixels)"
    return (f"store      {what} ({store.get('field', 'rgb8')}): {store.get('raw_samples')} image(s) as pixels, "
            f"{format_bytes(total)} on disk, ~{format_bytes(as_jpeg)} as JPEG ({total / max(1, as_jpeg):.1f}x)")


def _add_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("dst", metavar="DST", help="a packed dataset folder (or a folder of WebDataset tars)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _run_info(args: argparse.Namespace) -> int:
    import json

    from fastfeed.packed.checks import info

    d = info(args.dst)
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    from fastfeed._util import format_bytes

    sps = d["samples_per_shard"]
    print(d["path"])
    dali = ", DALI index files" if d["dali_index"] else ""
    if d.get("foreign"):
        print(f"  format     {d['format']}: {d['note']}")
    else:
        print(f"  format     {d['format']}{dali} (packed from {d['input']} by fastfeed "
              f"{d['fastfeed_version']}, index v{d['index_version']})")
    print(f"  samples    {d['num_samples']} in {d['num_shards']} shard(s) of {sps['min']}-{sps['max']}, "
          f"{format_bytes(d['bytes'])}")
    print(f"  fields     {', '.join(d['fields'])}")
    st = d.get("store") or {}
    if st.get("mode", "jpeg") != "jpeg":
        print(f"  {_store_line(st, d['bytes'])}")
    elif not d.get("foreign"):
        print("  store      jpeg (images as encoded files; `fastfeed pack --store raw` trades disk for CPU)")
    if d["classes"] is not None:
        shown = ", ".join(d["classes"][:4]) + (", ..." if d["num_classes"] > 4 else "")
        spc = d.get("samples_per_class")
        per = f"; {spc['min']}-{spc['max']} samples per class" if spc else ""
        print(f"  classes    {d['num_classes']} ({shown}){per}")
    if d["lengths"] is not None:
        ln = d["lengths"]
        print(f"  lengths    {ln['field']}: min {ln['min']}, median {ln['median']:g}, max {ln['max']}, "
              f"total {ln['total']}")
    if d.get("tokenizer"):
        t = d["tokenizer"]
        stored = f"ids in {t['tokens']}" if t.get("tokens") else "counted only"
        print(f"  tokenizer  {t.get('field')} ({stored}): vocab {t.get('vocab_size')}, {t.get('dtype')}, "
              f"pad id {t.get('pad_id')}, {t.get('total_tokens')} tokens")
    o = d["options"]
    order = f"shuffled (seed {o.get('seed')})" if o.get("shuffle") else "key order"
    if d.get("foreign"):
        order = "as stored in the tars"
    resize = f", images resized to max side {o['max_side']} (quality {o['quality']})" if o.get("max_side") else ""
    resize += ", JPEGs with restart markers (crops decode only their blocks)" if o.get("jpeg_restarts") else ""
    print(f"  order      {order}{resize}")
    where = " (hidden or damaged members, see -v)" if d.get("foreign") else " (see skipped.txt)"
    print(f"  skipped    {d['num_skipped']}" + (where if d["num_skipped"] else ""))
    return 0


def _add_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("dst", metavar="DST", help="a packed dataset folder (or a folder of WebDataset tars: "
                   "members read, images decoded)")
    p.add_argument("--workers", default="auto", metavar="N", help="processes (default auto: one per core)")
    p.add_argument("--no-decode", action="store_true", help="skip decoding images (bytes and checksums only)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _run_verify(args: argparse.Namespace) -> int:
    import json

    from fastfeed.errors import ConfigError
    from fastfeed.packed.checks import verify

    workers: int | str = "auto"  # verify() counts the usable cores (cgroup quota included)
    if args.workers != "auto":
        try:
            workers = int(args.workers)
        except ValueError:
            raise ConfigError(f"--workers {args.workers!r}: write a number or auto") from None
    bar = Progress("verify", "shard")
    try:
        report = verify(args.dst, workers=workers, decode=not args.no_decode, progress=bar.update)
    finally:
        bar.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    elif report.ok:
        print(f"ok: {report.shards} shard(s), {report.samples} samples, {report.images} images decoded")
    else:
        print(f"{args.dst}: {len(report.problems)} problem(s):", file=sys.stderr)
        for line in report.problems:
            print(f"  {line}", file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


# ---------------------------------------------------------------- balance
# (section owned by the samplers issue)
_BALANCE_HELP = ("compare padding and rank balance of fastfeed's length-aware samplers with "
                 "DistributedSampler + a fixed batch, over one epoch")


def _add_balance(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _run_balance(args: argparse.Namespace) -> int:
    import json

    from fastfeed.sampling.balance import balance_report

    cost = args.model if args.model else args.cost
    max_cost = args.max_cost
    if max_cost is not None:
        try:
            max_cost = float(max_cost)
        except ValueError:
            pass  # a duration such as "120ms", checked against the model by the sampler
    report = balance_report(args.dst, world_size=args.world_size, batch_size=args.batch_size,
                            max_cost=max_cost, cost=cost, seed=args.seed, epoch=args.epoch,
                            drop_last=args.drop_last, baseline_batch_size=args.baseline_batch_size)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.table())
    return 0



# ---------------------------------------------------------------- tune
# (section owned by the tune issue)
_TUNE_HELP = "measure the loader and store the best num_workers / prefetch_factor for this host"


def _add_tune(p: argparse.ArgumentParser) -> None:
    p.add_argument("dst", metavar="DST", help="a packed dataset (folder or URL)")
    _add_sizes(p)
    p.add_argument("--decode", default="cpu", choices=["cpu", "dali", "none"],
                   help="decode mode: cpu, dali or none (raw bytes; default cpu)")
    p.add_argument("--time-budget", default="60s", help="measuring time, e.g. 60s or 2m (default 60s)")
    p.add_argument("--max-workers", type=int, default=None,
                   help="cap on workers (default: twice the cores per rank)")
    _add_demand(p, "what one rank's training consumes: pick the cheapest setting that feeds it")
    p.add_argument("--memory-budget", default=None,
                   help="main + worker memory a setting may use, e.g. 16GB (default: half the "
                        "memory / LOCAL_WORLD_SIZE)")
    p.add_argument("--trial-time", type=float, default=None, metavar="SECONDS",
                   help="seconds per measured setting (default: from the time budget)")
    p.add_argument("--plot", default=None, metavar="PNG", help="draw throughput against workers")
    p.add_argument("--store-dir", default=None,
                   help="store the result here (default: the dataset folder, else ~/.cache/fastfeed)")
    p.add_argument("--no-store", action="store_true", help="measure only; do not store the result")
    p.add_argument("--replace", action="store_true",
                   help="store the result even when the stored one is better (steady, confirmed or longer)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_sizes(p: argparse.ArgumentParser) -> None:
    """--batch-size / --image-size with the defaults tune and doctor share (fastfeed.tuning.defaults)."""
    from fastfeed.tuning.defaults import DEFAULT_BATCH_SIZE, DEFAULT_IMAGE_SIZE

    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help=f"per-rank batch size training uses (default {DEFAULT_BATCH_SIZE})")
    p.add_argument("--image-size", default=None, metavar="PX",
                   help=f"output image size training uses, or none for no resizing (default "
                        f"{DEFAULT_IMAGE_SIZE} when the data has images)")


def _sizes(args: argparse.Namespace, decode: str | None, cache_dir: Any = None) -> tuple[int | None, Any]:
    """(batch size, image size) to pass on; prints one line on stderr saying what was assumed."""
    from fastfeed.formats.naming import holds_pixels
    from fastfeed.errors import ConfigError
    from fastfeed.packed.reader import resolve_index
    from fastfeed.tuning.defaults import resolve_defaults

    size: Any = "auto"
    if args.image_size is not None:
        if args.image_size.lower() == "none":
            size = None
        else:
            try:
                size = int(args.image_size)
            except ValueError:
                raise ConfigError(f"--image-size {args.image_size!r}: write a number of pixels or none") from None
    try:
        index = resolve_index(args.dst, cache_dir=cache_dir)
    except FastfeedError:  # the command itself reports it, with its own advice
        return args.batch_size, size
    chosen = resolve_defaults(has_images=any(holds_pixels(f) for f in index.fields), batch_size=args.batch_size,
                              image_size=size, decode=decode)
    if chosen.line():
        print(chosen.line(), file=sys.stderr, flush=True)
    return chosen.batch_size, chosen.image_size


def _run_tune(args: argparse.Namespace) -> int:
    import json

    from fastfeed.tuning.api import tune
    from fastfeed.tuning.search import Trial

    def progress(t: Trial) -> None:
        m = t.measurement
        rate = f"{m.samples_per_s:,.0f} samples/s" if m is not None else t.status
        flag = "" if m is None or m.steady else f" (not steady: {m.note})"
        print(f"  {t.phase:<8} {t.setting.label}: {rate}{flag}", file=sys.stderr, flush=True)

    decode = None if args.decode == "none" else args.decode
    batch_size, image_size = _sizes(args, decode)
    result = tune(
        args.dst, batch_size=batch_size, decode=decode, image_size=image_size,
        time_budget=args.time_budget, max_workers=args.max_workers, target_rate=args.target_rate,
        step_time=args.step_time, memory_budget=args.memory_budget, trial_time=args.trial_time,
        plot=args.plot,
        store=not args.no_store, store_dir=args.store_dir, replace_better=args.replace,
        on_trial=None if args.json else progress,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
        for note in result.notes:
            print(f"warning: {note}", file=sys.stderr)
    else:
        print(result.table())
        print()
        print(result.summary())
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


# ---------------------------------------------------------------- doctor
# (section owned by the doctor issue)
_DOCTOR_HELP = ("measure storage, decode, the loader and rank balance on their own, and name the stage "
                "that limits training, with the figures and the fix")


def _add_demand(p: argparse.ArgumentParser, rate_help: str) -> None:
    """--target-rate / --step-time: what the training consumes (tune and doctor)."""
    goal = p.add_mutually_exclusive_group()
    goal.add_argument("--target-rate", type=float, default=None, metavar="SAMPLES_PER_S", help=rate_help)
    goal.add_argument("--step-time", type=float, default=None, metavar="SECONDS",
                      help="one rank's training step time per batch (demand = batch size / step time)")


def _add_doctor(p: argparse.ArgumentParser) -> None:
    p.add_argument("dst", metavar="DST", help="a packed dataset (folder or URL), or WebDataset tars")
    p.add_argument("--source", default=None, metavar="RAW_FOLDER",
                   help="the raw folder DST was packed from: also measure its small-file reads")
    _add_demand(p, "what one rank's training consumes, in samples/s")
    p.add_argument("--world-size", type=int, default=None, metavar="W",
                   help="ranks, for the length balance (default: WORLD_SIZE, else 1)")
    _add_sizes(p)
    p.add_argument("--decode", default="cpu", choices=["cpu", "dali", "none"], help="decode mode (default cpu)")
    p.add_argument("--num-workers", default="auto", metavar="N",
                   help="loader workers (default auto: the tuned setting, else loader()'s heuristic)")
    p.add_argument("--prefetch-factor", default="auto", metavar="N", help="batches in flight per worker")
    p.add_argument("--time-budget", default="60s", help="total measuring time, e.g. 60s or 2m (default 60s)")
    p.add_argument("--cache-dir", default=None, help="local shard cache for remote data, as in loader()")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--report", default=None, metavar="HTML", help="also write a self-contained HTML report")
    p.add_argument("--fail-if-input-bound", action="store_true",
                   help="exit 1 when the verdict is input-bound (needs --target-rate or --step-time), "
                        "so a CI job can gate on it")


def _auto_int(value: str, name: str) -> int | str:
    from fastfeed.errors import ConfigError

    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name} {value!r}: write a number or auto") from None


def _run_doctor(args: argparse.Namespace) -> int:
    import json

    from fastfeed.diagnosis.api import doctor
    from fastfeed.errors import ConfigError

    def progress(stage: object) -> None:
        print(f"  measured {getattr(stage, 'name', stage)}", file=sys.stderr, flush=True)

    if args.fail_if_input_bound and args.target_rate is None and args.step_time is None:
        raise ConfigError("--fail-if-input-bound needs what training consumes: pass --target-rate SAMPLES_PER_S "
                          "or --step-time SECONDS (without a demand there is no input-bound verdict)")
    decode = None if args.decode == "none" else args.decode
    batch_size, image_size = _sizes(args, decode, args.cache_dir)
    result = doctor(
        args.dst, source=args.source, target_rate=args.target_rate, step_time=args.step_time,
        world_size=args.world_size, batch_size=batch_size, image_size=image_size, decode=decode,
        num_workers=_auto_int(args.num_workers, "--num-workers"),
        prefetch_factor=_auto_int(args.prefetch_factor, "--prefetch-factor"),
        time_budget=args.time_budget, cache_dir=args.cache_dir, report=args.report,
        on_stage=None if args.json else progress,
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



# ---------------------------------------------------------------- wiring
#: (name, help, add-arguments function, runner), in the order shown by --help.
COMMANDS: list[tuple[str, str, Callable[[argparse.ArgumentParser], None], Runner]] = []
COMMANDS += [("pack", _PACK_HELP, _add_pack, _run_pack), ("info", _INFO_HELP, _add_info, _run_info),
             ("verify", _VERIFY_HELP, _add_verify, _run_verify)]
COMMANDS.append(("tune", _TUNE_HELP, _add_tune, _run_tune))
COMMANDS.append(("balance", _BALANCE_HELP, _add_balance, _run_balance))
COMMANDS.append(("doctor", _DOCTOR_HELP, _add_doctor, _run_doctor))


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (used by :func:`main` and the docs)."""
    parser = argparse.ArgumentParser(
        prog="fastfeed",
        description="Pack, load, tune and diagnose input pipelines for multi-GPU PyTorch training.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fastfeed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details and show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_, add, run in COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        add(p)
        # -v after the command too; SUPPRESS keeps the value given before it when absent here
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="log progress details and show tracebacks")
        p.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see the module docstring: 0 ok, 1 problems, 2 usage, 3 internal)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2, message already printed)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="fastfeed: %(message)s",
    )
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args._run(args))
    except FastfeedError as e:
        print(f"fastfeed {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a bug: one line (exit 3), the traceback with -v
        if args.verbose:
            import traceback

            traceback.print_exc()
        hint = "the traceback is above" if args.verbose else "run again with -v for the traceback"
        print(f"fastfeed {args.command}: internal error: {type(e).__name__}: {e} ({hint}; please report it)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
