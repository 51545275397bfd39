"""Issue 19: tokenize-and-pack rows/s and tokens/s, fastfeed vs the HF ``datasets`` way.

One parquet text dataset (``bench-data/text-<rows>.parquet``, generated: Zipf-distributed
pseudo-words in sentences and paragraphs, lognormal document lengths; see
``benchmarks/_text.py``) and one byte-level BPE tokenizer trained on it at run time
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
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_DATA, environment, log  # noqa: E402
from _text import fastfeed_pack_to, hf_save_to, text_parquet, text_tokenizer  # noqa: E402


def _cpu_seconds() -> float:
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _hf_tokens(out: Path) -> int:
    import pyarrow.compute as pc
    from datasets import load_from_disk

    col = load_from_disk(str(out)).data.column("input_ids")
    return int(pc.sum(pc.list_value_length(col)).as_py())


def run_one(tool: str, parquet: str, tok: str, out: str, workers: str) -> dict[str, Any]:
    """One timed run (meant for a fresh process: :func:`_run_isolated`)."""
    src, tok_json, dst = Path(parquet), Path(tok), Path(out)
    if tool == "fastfeed":
        import fastfeed  # noqa: F401 - imported before the clock starts, as datasets is below
        import fastfeed.cli  # noqa: F401
        import fastfeed.packing.content.tokenize  # noqa: F401
        import tokenizers  # noqa: F401

        c0, t0 = _cpu_seconds(), time.perf_counter()
        with open(os.devnull, "w") as null:  # the CLI's summary lines
            old, sys.stdout = sys.stdout, null
            try:
                rc = fastfeed_pack_to(src, tok_json, dst, workers)
            finally:
                sys.stdout = old
        took, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
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
        c0, t0 = _cpu_seconds(), time.perf_counter()
        ds = hf_save_to(src, tok_json, dst, int(workers), cache)
        took, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
        rows, tokens = len(ds), _hf_tokens(dst)
        shutil.rmtree(cache, ignore_errors=True)
    return {"seconds": took, "cpu": cpu, "rows": rows, "tokens": tokens, "bytes": _tree_bytes(dst)}


def _run_isolated(tool: str, parquet: Path, tok: Path, out: Path, workers: str) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); import pack_text as p; "
            f"print('RUN ' + json.dumps(p.run_one({tool!r}, {str(parquet)!r}, {str(tok)!r}, {str(out)!r}, "
            f"{workers!r})))")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RUN ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{tool} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[4:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=40_000, help="documents in the parquet file (default 40000)")
    ap.add_argument("--num-proc", type=int, default=os.cpu_count() or 1,
                    help="the HF map's num_proc and fastfeed's matching --workers (default: the cores)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every run, interleaved (default 1)")
    ap.add_argument("--out", type=Path, default=BENCH_DATA / "pack-text-out", help="where outputs go")
    ap.add_argument("--json", type=Path, default=None, help="also write the RESULT dict here")
    args = ap.parse_args(argv)

    env = environment()
    parquet = text_parquet(args.rows)
    tok = text_tokenizer(parquet)
    with open(parquet, "rb") as f:  # page cache: the source is read from memory by every run
        while f.read(1 << 24):
            pass
    n = args.num_proc
    runs = {f"fastfeed pack (default workers: auto={os.cpu_count()})": ("fastfeed", "auto"),
            f"fastfeed pack --workers {n}": ("fastfeed", str(n)),
            f"HF load_dataset+map+save_to_disk num_proc={n}": ("hf", str(n))}
    if n == os.cpu_count():  # auto is n workers: one fastfeed row
        runs.pop(f"fastfeed pack --workers {n}")
    subject, peer = next(iter(runs)), list(runs)[-1]
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in runs}
    args.out.mkdir(parents=True, exist_ok=True)
    for r in range(args.repeat):
        for name, (tool, workers) in (runs.items() if r % 2 == 0 else reversed(runs.items())):
            res = _run_isolated(tool, parquet, tok, args.out / tool, workers)
            log(f"{name}: {res['seconds']:.1f} s, {res['cpu']:.1f} CPU-s, {res['tokens']:,} tokens")
            got[name].append(res)
    tokens = {res["tokens"] for rs in got.values() for res in rs}
    if len(tokens) != 1:
        raise SystemExit(f"the tools disagree on the token count: {sorted(tokens)}")

    def med(name: str, key: str) -> float:
        return statistics.median(x[key] for x in got[name])

    print(f"\n== pack + tokenize {args.rows:,} parquet rows ({next(iter(tokens)):,} tokens), {os.cpu_count()} cores")
    print(f"{'tool':<52}{'rows/s':>10}{'tokens/s':>12}{'rows/CPU-s':>12}{'tokens/CPU-s':>14}{'s':>7}{'MB out':>8}")
    table = {}
    for name in runs:
        s, c = med(name, "seconds"), med(name, "cpu")
        rows, toks = got[name][0]["rows"], got[name][0]["tokens"]
        table[name] = {"rows_per_s": rows / s, "tokens_per_s": toks / s, "rows_per_cpu_s": rows / c,
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
    out = {"title": "pack_text", "env": env, "rows": args.rows, "tokens": next(iter(tokens)),
           "num_proc": n, "subject": subject, "peer": peer, "results": table, "ratios": ratios}
    print("RESULT " + json.dumps(out, sort_keys=True))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
