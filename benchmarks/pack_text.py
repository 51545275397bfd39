"""Issue 19: tokenize-and-pack rows/s and tokens/s, fastfeed vs the HF ``datasets`` way.

One parquet text dataset (``bench-data/text-<rows>.parquet``, generated: Zipf-distributed
pseudo-words in sentences and paragraphs, lognormal document lengths; see
:mod:`benchmarks.lib.text`) and one byte-level BPE tokenizer trained on it at run time
(16,384 tokens, ``tokenizers``; nothing downloaded) are turned into a tokenized dataset on
disk, in one run, by

- ``fastfeed pack data.parquet DST --tokenizer tok.json --tokenize text`` (the CLI's
  ``main`` in a fresh process), with its default ``--workers`` (auto: one per core) and with
  ``--workers N``, N the peer's ``num_proc``: text and token ids (uint16) stored per row,
  exact token counts in ``lengths.npy``, sha256 of every shard, the index;
- the HF way: ``datasets.load_dataset("parquet", data_files=...)`` (which converts the
  parquet to its Arrow cache), ``.map(tokenize, batched=True, num_proc=N)`` with
  ``tokenize = PreTrainedTokenizerFast(tokenizer_object=...)(batch["text"],
  return_attention_mask=False)`` (the text column kept, as fastfeed keeps it), then
  ``.save_to_disk(DST, num_proc=N)``; its caches go to a fresh folder every run.

Every run happens in a fresh Python process, timed from the call to its return after the
tool's modules are imported; the previous output is removed and synced away first and the
parquet file is in the page cache (read once). Reported: rows/s and tokens/s (the dataset's
token count, the same for both: checked), the CPU seconds of the process and its workers
(on a shared machine wall time measures the other tenants too), and the output size.
Runs are interleaved (A-B-A-B) with ``--repeat``; the median is reported.

Run (2 cores, ~3 min with the defaults of this machine)::

    .venv/bin/python benchmarks/pack_text.py --rows 40000 --repeat 2
    .venv/bin/python benchmarks/pack_text.py --rows 200000 --num-proc 16     # a larger host

Prints a table, fastfeed's ratios to the HF way (wall clock and per CPU-second) and one
``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.data import BENCH_DATA  # noqa: E402
from benchmarks.lib.measure import Stopwatch, rusage_cpu_seconds  # noqa: E402
from benchmarks.lib.report import log  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402
from benchmarks.lib.text import fastfeed_pack_to, hf_save_to, text_parquet, text_tokenizer  # noqa: E402

#: the runs: fastfeed at its default workers, at the peer's num_proc (when that differs), the HF way
RUNS = ("fastfeed-auto", "fastfeed-n", "hf")


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _hf_tokens(out: Path) -> int:
    import pyarrow.compute as pc
    from datasets import load_from_disk

    col = load_from_disk(str(out)).data.column("input_ids")
    return int(pc.sum(pc.list_value_length(col)).as_py())


def run_one(tool: str, src: Path, tok_json: Path, dst: Path, workers: str) -> dict[str, Any]:
    """One timed run (in a fresh process: the runner starts one per point)."""
    if tool == "fastfeed":
        import fastfeed  # noqa: F401 - imported before the clock starts, as datasets is below
        import fastfeed.cli  # noqa: F401
        import fastfeed.packing.content.tokenize  # noqa: F401
        import tokenizers  # noqa: F401

        c0 = rusage_cpu_seconds()
        with Stopwatch() as sw, open(os.devnull, "w") as null:  # the CLI's summary lines
            old, sys.stdout = sys.stdout, null
            try:
                rc = fastfeed_pack_to(src, tok_json, dst, workers)
            finally:
                sys.stdout = old
        took, cpu = sw.wall, rusage_cpu_seconds() - c0
        if rc != 0:
            raise SystemExit(f"fastfeed pack exited {rc}")
        from fastfeed.packed.index import DatasetIndex

        idx = DatasetIndex.load(dst)
        tokens, rows = int(idx.lengths.sum()), idx.num_samples
    else:
        import datasets  # noqa: F401
        import transformers  # noqa: F401

        cache = dst.with_name(dst.name + ".cache")
        shutil.rmtree(cache, ignore_errors=True)
        c0 = rusage_cpu_seconds()
        with Stopwatch() as sw:
            ds = hf_save_to(src, tok_json, dst, int(workers), cache)
        took, cpu = sw.wall, rusage_cpu_seconds() - c0
        rows, tokens = len(ds), _hf_tokens(dst)
        shutil.rmtree(cache, ignore_errors=True)
    return {"seconds": took, "cpu": cpu, "rows": rows, "tokens": tokens, "bytes": _tree_bytes(dst)}


def _runs(args: argparse.Namespace) -> dict[str, tuple[str, str, str]]:
    """key -> (its name in the table, the tool, its workers)."""
    n = args.num_proc
    return {"fastfeed-auto": (f"fastfeed pack (default workers: auto={os.cpu_count()})", "fastfeed", "auto"),
            "fastfeed-n": (f"fastfeed pack --workers {n}", "fastfeed", str(n)),
            "hf": (f"HF load_dataset+map+save_to_disk num_proc={n}", "hf", str(n))}


def options(ap: argparse.ArgumentParser) -> None:
    """Corpus size, the peer's num_proc, where outputs go."""
    ap.add_argument("--rows", type=int, default=40_000, help="documents in the parquet file (default 40000)")
    ap.add_argument("--num-proc", type=int, default=os.cpu_count() or 1,
                    help="the HF map's num_proc and fastfeed's matching --workers (default: the cores)")
    ap.add_argument("--out", type=Path, default=BENCH_DATA / "pack-text-out", help="where outputs go")


def prepare(ctx: Context) -> dict[str, Path]:
    """The parquet corpus and the tokenizer; the parquet file in the page cache."""
    parquet = text_parquet(ctx.args.rows)
    tok = text_tokenizer(parquet)
    with open(parquet, "rb") as f:  # page cache: the source is read from memory by every run
        while f.read(1 << 24):
            pass
    ctx.args.out.mkdir(parents=True, exist_ok=True)
    return {"parquet": parquet, "tokenizer": tok}


def skip(point: Point, ctx: Context) -> str | None:
    """One fastfeed row when its default (auto: one per core) is the peer's ``num_proc``."""
    if point["run"] == "fastfeed-n" and ctx.args.num_proc == os.cpu_count():
        return "fastfeed pack --workers N: the same as the default workers here (auto = the cores)"
    return None


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """One run, output removed and synced away first."""
    _, tool, workers = _runs(ctx.args)[point["run"]]
    out = ctx.args.out / tool
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    return run_one(tool, ctx.data["parquet"], ctx.data["tokenizer"], out, workers)


def point_env(point: Point) -> dict[str, str]:
    """No download, no hint lines."""
    return {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def progress(point: Point, res: dict[str, Any]) -> str:
    """The run's times and tokens."""
    return f"{point['run']}: {res['seconds']:.1f} s, {res['cpu']:.1f} CPU-s, {res['tokens']:,} tokens"


def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """rows/s and tokens/s per run (medians), fastfeed against the HF way."""
    args, names = ctx.args, _runs(ctx.args)
    got: dict[str, list[dict[str, Any]]] = {}
    for pt, res in rows:
        got.setdefault(names[pt["run"]][0], []).append(res)
    tokens = {res["tokens"] for rs in got.values() for res in rs}
    if len(tokens) != 1:
        raise SystemExit(f"the tools disagree on the token count: {sorted(tokens)}")
    runs = [names[k][0] for k in RUNS if names[k][0] in got]
    subject, peer = runs[0], runs[-1]

    def med(name: str, key: str) -> float:
        return statistics.median(x[key] for x in got[name])

    print(f"\n== pack + tokenize {args.rows:,} parquet rows ({next(iter(tokens)):,} tokens), {os.cpu_count()} cores")
    print(f"{'tool':<52}{'rows/s':>10}{'tokens/s':>12}{'rows/CPU-s':>12}{'tokens/CPU-s':>14}{'s':>7}{'MB out':>8}")
    table = {}
    for name in runs:
        s, c = med(name, "seconds"), med(name, "cpu")
        n_rows, toks = got[name][0]["rows"], got[name][0]["tokens"]
        table[name] = {"rows_per_s": n_rows / s, "tokens_per_s": toks / s, "rows_per_cpu_s": n_rows / c,
                       "tokens_per_cpu_s": toks / c, "seconds": s, "cpu_s": c,
                       "mb_out": got[name][0]["bytes"] / 1e6, "runs": got[name]}
        t = table[name]
        print(f"{name:<52}{t['rows_per_s']:>10,.0f}{t['tokens_per_s']:>12,.0f}{t['rows_per_cpu_s']:>12,.0f}"
              f"{t['tokens_per_cpu_s']:>14,.0f}{s:>7.1f}{t['mb_out']:>8.0f}")
    ratios = {}
    print("ratios (fastfeed / HF, same run):")
    for name in runs:
        if name == peer:
            continue
        wall = table[name]["tokens_per_s"] / table[peer]["tokens_per_s"]
        cpu = table[name]["tokens_per_cpu_s"] / table[peer]["tokens_per_cpu_s"]
        ratios[name] = {"wall": wall, "per_cpu_s": cpu}
        print(f"  {name}: {wall:.2f}x wall clock, {cpu:.2f}x per CPU-second")
    log(f"outputs in {args.out}")
    return {"title": "pack_text", "env": ctx.env, "rows": args.rows, "tokens": next(iter(tokens)),
            "num_proc": args.num_proc, "subject": subject, "peer": peer, "results": table, "ratios": ratios}


BENCHMARK = Benchmark(
    name="pack_text", doc=__doc__, options=options, prepare=prepare, skip=skip, run_point=run_point,
    point_env=point_env, progress=progress, report=report, isolate=True,
    needs=("datasets", "transformers", "tokenizers", "pyarrow"),
    grid=(REPEAT, Axis("run", RUNS, help="fastfeed at its default workers, at the peer's num_proc; the HF way",
                       alternate=True)),
    quick={"rows": 5_000},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
