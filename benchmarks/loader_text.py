"""Issue 19: loader tokens/s, fastfeed packed and padded batches vs HF ``datasets`` + ``DataCollatorWithPadding``.

Goal: fastfeed >= 3x the HF way in real (non-pad) tokens/s, with the same workers and batch
size: fastfeed reads token ids stored at pack time as uint16 arrays, the HF way converts
Arrow lists to tensors row by row and pads them in Python.

Data: the parquet corpus and BPE tokenizer of ``pack_text.py`` (:mod:`benchmarks.lib.text`:
generated text, lognormal document lengths, 16,384-token byte-level BPE), tokenized once
both ways: ``fastfeed pack --tokenizer --tokenize text`` and HF ``map(tokenizer)`` +
``save_to_disk``. Loaders, each with ``--workers`` worker processes and shuffling:

- ``fastfeed packed``: ``fastfeed.loader(DST, batch_size=R, seq_len=L)``, rows of exactly L
  tokens (``input_ids``, ``position_ids``, ``cu_seqlens``, ``valid``); R is chosen so that a
  batch holds about as many tokens as ``--batch`` padded documents (``R = batch x mean
  length / L``, at least 1);
- ``fastfeed padded``: ``fastfeed.loader(DST, batch_size=B)``, ``input_ids`` and
  ``attention_mask`` padded to the longest document of the batch;
- ``HF datasets + DataCollatorWithPadding``: ``load_from_disk(HF).with_format("torch",
  columns=["input_ids"])`` in a ``torch.utils.data.DataLoader(batch_size=B, shuffle=True,
  num_workers=W, persistent_workers=True, collate_fn=DataCollatorWithPadding(tok))``,
  ``tok = PreTrainedTokenizerFast(tokenizer_object=...)``: the same padded batches.

Every rate comes from ``fastfeed.timing.measure`` (start-up and warm-up left out, median of
steady windows), counting real tokens per batch (``valid`` / ``attention_mask`` sums); padded
tokens/s are the real rate times the padded/real ratio of the batches seen, and tokens per
CPU-second of the loader's processes (steady on a shared machine) come with them. Loaders are
measured in rounds, interleaved (``--repeat``), median reported.

Run (2 cores, ~3 min)::

    .venv/bin/python benchmarks/loader_text.py --rows 40000 --workers 2 --time 8 --repeat 2

Prints a table, fastfeed's ratios to the HF loader and one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.loaders import fastfeed_loader  # noqa: E402
from benchmarks.lib.measure import measure_source  # noqa: E402
from benchmarks.lib.report import log  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402
from benchmarks.lib.text import fastfeed_pack, hf_save, hf_tokenizer, text_parquet, text_tokenizer  # noqa: E402

GOAL = 3.0
PEER = "HF datasets + DataCollatorWithPadding"
LOADERS = ("fastfeed packed", "fastfeed padded", PEER)


def real_tokens(batch: dict[str, Any]) -> int:
    """Non-pad tokens of a batch: ``valid`` of packed rows, else the ``attention_mask``.

    Summed with numpy: ``Tensor.sum`` of a (32, 2000) mask runs on torch's intra-op threads,
    which on 2 cores spin against the loader's workers (5.7 ms a call, measured; it cut the
    padded loaders' rates 3-4x).
    """
    mask = batch["valid"] if "position_ids" in batch else batch["attention_mask"]
    return int(mask.numpy().sum())


class Counter:
    """Padded and real tokens of the batches seen (``consume`` of the measurement)."""

    def __init__(self) -> None:
        self.real = self.padded = 0

    def __call__(self, batch: dict[str, Any]) -> None:
        self.real += real_tokens(batch)
        self.padded += int(batch["input_ids"].numel())


def make_loaders(ff: Path, hf: Path, tok_json: Path, args: argparse.Namespace,
                 rows: int) -> dict[str, tuple[Callable[[], Any], str]]:
    """Every loader of :data:`LOADERS`: name -> (start an epoch, what it is)."""
    W, B, L = args.workers, args.batch, args.seq_len
    out: dict[str, tuple[Callable[[], Any], str]] = {}
    packed = fastfeed_loader(ff, batch_size=rows, seq_len=L, workers=W)
    out["fastfeed packed"] = (lambda: iter(packed), f"loader(batch_size={rows}, seq_len={L}, num_workers={W})")
    padded = fastfeed_loader(ff, batch_size=B, workers=W)
    out["fastfeed padded"] = (lambda: iter(padded), f"loader(batch_size={B}, num_workers={W})")

    import torch
    from datasets import load_from_disk
    from transformers import DataCollatorWithPadding

    ds = load_from_disk(str(hf)).with_format("torch", columns=["input_ids"])
    collate = DataCollatorWithPadding(hf_tokenizer(tok_json))
    hf_dl = torch.utils.data.DataLoader(ds, batch_size=B, shuffle=True, num_workers=W, collate_fn=collate,
                                        persistent_workers=W > 0)
    out[PEER] = (lambda: iter(hf_dl), f"DataLoader(load_from_disk().with_format('torch'), batch_size={B}, "
                                      f"num_workers={W}, collate_fn=DataCollatorWithPadding)")
    return out


def options(ap: argparse.ArgumentParser) -> None:
    """Corpus size, workers, batch shapes, time."""
    ap.add_argument("--rows", type=int, default=40_000, help="documents (default 40000)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="loader workers, every loader")
    ap.add_argument("--batch", type=int, default=32, help="documents per padded batch (default 32)")
    ap.add_argument("--seq-len", type=int, default=1024, help="row length of packed batches (default 1024)")
    ap.add_argument("--time", type=float, default=8.0, help="steady seconds per measurement (default 8)")


def prepare(ctx: Context) -> dict[str, Any]:
    """The corpus tokenized both ways, and the loaders over it (built once, measured in rounds)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the collator only pads; no fork warnings
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # "use __call__ rather than pad" hint, per worker
    args = ctx.args
    parquet = text_parquet(args.rows)
    tok = text_tokenizer(parquet)
    ff, hf = fastfeed_pack(parquet, tok), hf_save(parquet, tok)
    from fastfeed.packed.index import DatasetIndex

    lengths = DatasetIndex.load(ff).lengths
    rows = max(1, round(args.batch * float(lengths.mean()) / args.seq_len))
    return {"lengths": lengths, "packed_rows": rows, "loaders": make_loaders(ff, hf, tok, args, rows)}


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """One loader's steady real tokens/s (and per CPU-second), padding seen."""
    make_iter, _ = ctx.data["loaders"][point["loader"]]
    count = Counter()
    m, cpu = measure_source(make_iter, num_workers=ctx.args.workers, prefetch_factor=None,
                            steady_time=ctx.args.time, samples_of=real_tokens, consume=count)
    pad_ratio = count.padded / max(1, count.real)
    log(f"{point['loader']}: {m.samples_per_s:,.0f} real tokens/s ({m.batches} batches, steady={m.steady})")
    return {"real_per_s": m.samples_per_s, "padded_per_s": m.samples_per_s * pad_ratio,
            "real_per_cpu_s": 1 / cpu if cpu else 0.0, "padding_efficiency": 1 / pad_ratio,
            "batches": m.batches, "steady": m.steady, "batches_per_s": m.batches_per_s}


def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """Median of the rounds per loader; fastfeed's against the HF loader's (real tokens, same run)."""
    args, lengths, packed_rows = ctx.args, ctx.data["lengths"], ctx.data["packed_rows"]
    loaders = ctx.data["loaders"]
    got: dict[str, list[dict[str, Any]]] = {}
    for pt, r in rows:
        got.setdefault(pt["loader"], []).append(r)

    def med(name: str, key: str) -> float:
        return statistics.median(x[key] for x in got[name])

    mean = float(lengths.mean())
    print(f"\n== loader tokens/s, {args.rows:,} documents ({int(lengths.sum()):,} tokens, mean {mean:.0f}), "
          f"{args.workers} workers, padded batch {args.batch}, packed {packed_rows} x {args.seq_len}")
    print(f"{'loader':<40}{'real tok/s':>12}{'padded tok/s':>14}{'real tok/CPU-s':>16}{'pad eff.':>9}")
    table: dict[str, dict[str, Any]] = {}
    for name in got:
        t = {k: med(name, k) for k in ("real_per_s", "padded_per_s", "real_per_cpu_s", "padding_efficiency")}
        table[name] = {**t, "what": loaders[name][1], "runs": got[name]}
        print(f"{name:<40}{t['real_per_s']:>12,.0f}{t['padded_per_s']:>14,.0f}{t['real_per_cpu_s']:>16,.0f}"
              f"{t['padding_efficiency']:>9.3f}")
    for name in got:
        print(f"  {name}: {loaders[name][1]}")
    ratios: dict[str, dict[str, float]] = {}
    if PEER in table:
        print(f"ratios, real tokens (fastfeed / HF, same run; goal >= {GOAL:g}x):")
    for name in table:
        if name == PEER or PEER not in table:
            continue
        peer = table[PEER]
        wall = table[name]["real_per_s"] / peer["real_per_s"]
        cpu = (table[name]["real_per_cpu_s"] / peer["real_per_cpu_s"]) if peer["real_per_cpu_s"] else 0
        padded = table[name]["padded_per_s"] / peer["padded_per_s"]
        ratios[name] = {"wall": wall, "per_cpu_s": cpu, "padded_wall": padded}
        print(f"  {name}: {wall:.2f}x wall clock [{'met' if wall >= GOAL else 'MISSED'}], {cpu:.2f}x per "
              f"CPU-second; padded tokens {padded:.2f}x")
    return {"title": "loader_text", "env": ctx.env, "rows": args.rows, "tokens": int(lengths.sum()),
            "args": {k: str(v) for k, v in vars(args).items() if k != "point"}, "packed_rows": packed_rows,
            "results": table, "ratios": ratios, "goal": GOAL}


BENCHMARK = Benchmark(
    name="loader_text", doc=__doc__, options=options, prepare=prepare, run_point=run_point, report=report,
    needs=("datasets", "transformers", "tokenizers", "pyarrow"),
    grid=(REPEAT, Axis("loader", LOADERS, help="the loaders compared", alternate=True)),
    quick={"rows": 5_000, "time": 3.0},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
