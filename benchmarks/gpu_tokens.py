"""Issue 19: real tokens/s of a transformer training step on one GPU, by batch kind.

The same packed token dataset feeds one model (a 12-layer, width-1024 bidirectional
transformer encoder, bf16 autocast, AdamW; identity-token loss on the real tokens only) through
``fastfeed.loader`` in four ways, each run until the same number of real (non-pad) tokens has
been trained on after a warm-up:

  packed        ``loader(DST, batch_size=R, seq_len=L)``: R rows of exactly L tokens, attention
                per document from ``cu_seqlens`` (varlen: no attention across documents, no pad)
  padded        ``loader(DST, batch_size=B)``: B random documents padded to the longest (to a
                multiple of 8), SDPA with a key-padding mask; B = R x L / mean length, so a step
                holds as many real tokens on average as a packed one
  budget        ``loader(DST, batch_sampler=DistributedTokenBudgetSampler(DST, max_cost=R x L))``:
                similar-length documents up to R x L padded tokens, padded, key-padding mask
  budget-varlen the budget's batches with the padding removed (tokens laid end to end, varlen
                attention): what bucketing costs when the model takes ``cu_seqlens``

Varlen attention (``--attention auto`` picks the first that runs a forward + backward here and
prints it): ``flash`` = ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10, CUDA), ``nested``
= SDPA on jagged nested tensors, ``flex`` = FlexAttention with a document mask, ``dense`` = SDPA
with a block-diagonal boolean mask (CPU smoke tests). cuDNN attention is off by default
(``--sdpa no-cudnn``): it plans every new shape, which padded and budget batches keep making
(``benchmarks/ddp_tokens.py`` measured that).

Data: ``--docs`` documents of lognormal(``--mu``, ``--sigma``) tokens, clamped to
[8, ``--max-len``], random ids below ``--vocab``, written as ``.tokens.npy`` files and packed
once with ``fastfeed.pack(..., length="len")`` into ``--data`` (reused while the recipe holds).
Time per step includes waiting for the loader (``--workers`` workers, pinned memory,
non-blocking copies); the wait is reported.

GPU (one H200, ~2-3 min; or ``FASTFEED_NO_DALI=1 bash benchmarks/gpu_runs.sh gputokens``)::

    python3 benchmarks/gpu_tokens.py --json $OUT/gpu_tokens.json

CPU smoke test (tiny model, proves it runs; not a result)::

    .venv/bin/python benchmarks/gpu_tokens.py --device cpu --layers 2 --d-model 64 --heads 4 \\
        --vocab 1024 --docs 2000 --max-len 256 --seq-len 256 --rows 4 --tokens 40000 --workers 1

Prints one table (real tokens/s, padded tokens/s, padding efficiency, step ms, loader wait,
speed-up vs padded) and one JSON line (``RESULT {...}``). A training step is timed as training sees
it (fixed warm-up steps, then steps until ``--tokens`` real tokens, the device synchronised at both
ends; :class:`benchmarks.lib.measure.Stopwatch`), not by :mod:`fastfeed.timing`'s steady windows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fastfeed  # noqa: E402

from benchmarks.lib.loaders import fastfeed_loader  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import Axis, Benchmark, Context  # noqa: E402

ATTN: dict[str, str] = {"impl": "dense"}
IMPLS = ("flash", "nested", "flex", "dense")

#: a varlen batch on the device: (cu_seqlens int32, cu_seqlens int64, min and max length, doc id per token or None)
Varlen = tuple[torch.Tensor, torch.Tensor, int, int, "torch.Tensor | None"]


# ----------------------------------------------------------------------------- model
def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vl: Varlen) -> torch.Tensor:
    """Attention within each document of packed ``[T, H, D]`` q, k, v (``ATTN["impl"]``)."""
    cu32, cu64, lo, hi, doc = vl
    impl = ATTN["impl"]
    if impl == "flash":
        from torch.nn.attention.varlen import varlen_attn

        return varlen_attn(q, k, v, cu32, cu32, hi, hi)
    if impl == "nested":
        # min/max given: otherwise every layer's SDPA computes them with a host sync
        q, k, v = (torch.nested.nested_tensor_from_jagged(t.contiguous(), cu64, min_seqlen=lo, max_seqlen=hi)
                   .transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).values()
    if impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        assert doc is not None
        T = q.shape[0]
        mask = create_block_mask(lambda b, h, i, j: doc[i] == doc[j], None, None, T, T, device=q.device)
        o = flex_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                           block_mask=mask)
        return o[0].transpose(0, 1)
    assert doc is not None  # dense: one SDPA with a block-diagonal mask (small T only)
    m = doc[:, None] == doc[None, :]
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=m)
    return o.transpose(0, 1)


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attend(self, h: torch.Tensor, key_mask: torch.Tensor | None, vl: Varlen | None) -> torch.Tensor:
        H = self.heads
        if vl is not None:  # packed [T, 3d]
            T = h.shape[0]
            q, k, v = h.view(T, 3, H, -1).unbind(1)
            return varlen_attention(q, k, v, vl).reshape(T, -1)
        n, L, _ = h.shape  # padded [n, L, 3d] with a key-padding mask [n, 1, 1, L]
        q, k, v = h.view(n, L, 3, H, -1).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask).transpose(1, 2).reshape(n, L, -1)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None, vl: Varlen | None) -> torch.Tensor:
        x = x + self.proj(self.attend(self.qkv(self.ln1(x)), key_mask, vl))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Encoder(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor, real: torch.Tensor, key_mask: torch.Tensor | None,
                vl: Varlen | None) -> torch.Tensor:
        """Logits of the real positions ``real`` (flat indices) only: no head FLOPs on padding."""
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x, key_mask, vl)
        x = x.reshape(-1, x.shape[-1]).index_select(0, real)
        return self.head(self.ln(x))


# ----------------------------------------------------------------------------- batches -> device
class Step:
    """One optimizer step of the model on a host batch (no host sync inside)."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        torch.manual_seed(0)
        self.dev, self.cuda = device, device.type == "cuda"
        self.model = Encoder(args.vocab, args.d_model, args.layers, args.heads).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=self.cuda or None)

    def put(self, t: torch.Tensor) -> torch.Tensor:
        if self.cuda:
            return (t if t.is_pinned() else t.pin_memory()).to(self.dev, non_blocking=True)
        return t

    def varlen(self, cu: torch.Tensor, hi: int) -> Varlen:
        cu = cu.to(torch.int64)
        doc = None
        if ATTN["impl"] in ("flex", "dense"):
            doc = self.put(torch.repeat_interleave(torch.arange(len(cu) - 1), cu.diff()))
        return self.put(cu.to(torch.int32)), self.put(cu), int(cu.diff().min()), int(hi), doc

    def run(self, ids: torch.Tensor, real_idx: torch.Tensor, key_mask: torch.Tensor | None,
            vl: Varlen | None) -> None:
        ids_d, idx_d = self.put(ids), self.put(real_idx)
        km = None if key_mask is None else self.put(key_mask)[:, None, None, :]
        with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=self.cuda):
            logits = self.model(ids_d, idx_d, km, vl)
            target = ids_d.reshape(-1).index_select(0, idx_d)
            loss = F.cross_entropy(logits.float(), target)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    # the batch kinds: (real tokens, tokens computed)
    def packed(self, b: dict[str, Any]) -> tuple[int, int]:
        ids = b["input_ids"].reshape(-1)
        valid = b["valid"].reshape(-1)
        self.run(ids, valid.nonzero().squeeze(1), None, self.varlen(b["cu_seqlens"], b["max_seqlen"]))
        return int(valid.sum()), ids.numel()

    def padded(self, b: dict[str, Any]) -> tuple[int, int]:
        mask = b["attention_mask"].bool()
        self.run(b["input_ids"], mask.reshape(-1).nonzero().squeeze(1), mask, None)
        return int(mask.sum()), mask.numel()

    def unpadded(self, b: dict[str, Any]) -> tuple[int, int]:
        mask = b["attention_mask"].bool()
        lens = mask.sum(1)
        ids = b["input_ids"][mask]  # row by row, real tokens only (padding is on the right)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
        self.run(ids, torch.arange(ids.numel()), None, self.varlen(cu, int(lens.max())))
        return ids.numel(), ids.numel()


def probe_attention(step: Step, wanted: str) -> list[str]:
    """Pick ``ATTN["impl"]``: ``wanted``, or with ``auto`` the first of IMPLS that runs here."""
    order = list(IMPLS) if wanted == "auto" else [wanted]
    if not step.cuda and wanted == "auto":
        order.remove("flash")
    tried = []
    lens = torch.tensor([5, 9, 3])
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    for impl in order:
        ATTN["impl"] = impl
        try:
            ids = torch.randint(1, 100, (int(lens.sum()),))
            step.run(ids, torch.arange(ids.numel()), None, step.varlen(cu, int(lens.max())))
            if step.cuda:
                torch.cuda.synchronize()
            tried.append(f"{impl}: ok")
            return tried
        except Exception as e:  # noqa: BLE001 - any failure means: try the next kernel
            tried.append(f"{impl}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
            step.opt.zero_grad(set_to_none=True)
    raise SystemExit("no varlen attention runs here: " + "; ".join(tried))


# ----------------------------------------------------------------------------- data
def build_data(args: argparse.Namespace) -> Path:
    """The packed token dataset (made once per recipe under ``--data``)."""
    recipe = {"docs": args.docs, "mu": args.mu, "sigma": args.sigma, "max_len": args.max_len,
              "vocab": args.vocab, "seed": 0, "version": 1}
    root = Path(args.data)
    dst, stamp = root / "packed", root / "recipe.json"
    try:
        if json.loads(stamp.read_text()) == recipe and (dst / "index.json").exists():
            return dst
    except (OSError, ValueError):
        pass
    shutil.rmtree(root, ignore_errors=True)
    src = root / "docs"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lens = np.clip(rng.lognormal(args.mu, args.sigma, args.docs), 8, args.max_len).astype(np.int64)
    dtype = np.uint16 if args.vocab <= 65536 else np.uint32
    with Stopwatch() as took:
        for i, n in enumerate(lens.tolist()):
            np.save(src / f"d{i:07d}.tokens.npy", rng.integers(1, args.vocab, n, dtype=dtype))
            (src / f"d{i:07d}.len").write_text(str(n))
        fastfeed.pack(src, dst, length="len", workers=min(16, os.cpu_count() or 1))
    shutil.rmtree(src)
    stamp.write_text(json.dumps(recipe))
    print(f"[gpu_tokens] built {args.docs} documents ({int(lens.sum()):,} tokens) in "
          f"{took.wall:.0f} s: {dst}", file=sys.stderr, flush=True)
    return dst


def run_config(name: str, batches: Callable[[], Iterator[dict[str, Any]]],
               fn: Callable[[dict[str, Any]], tuple[int, int]], step: Step, args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up steps, then steps until ``args.tokens`` real tokens: wall-clock rates (device synced)."""
    sync = torch.cuda.synchronize if step.cuda else (lambda: None)
    it = batches()
    for _ in range(args.warmup):
        fn(next(it))
    sync()
    real = computed = steps = 0
    wait = 0.0
    clock = Stopwatch.start()
    while real < args.tokens:
        with Stopwatch() as waited:
            try:
                b = next(it)
            except StopIteration:
                it = batches()
                b = next(it)
        wait += waited.wall
        r, c = fn(b)
        real, computed, steps = real + r, computed + c, steps + 1
    sync()
    dt = clock.elapsed()
    out = {"config": name, "real_tokens_per_s": real / dt, "computed_tokens_per_s": computed / dt,
           "padding_efficiency": real / computed, "step_ms": 1e3 * dt / steps, "steps": steps,
           "real_tokens": real, "seconds": dt, "loader_wait_share": wait / dt,
           "real_tokens_per_step": real / steps}
    if step.cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    print(f"[gpu_tokens] {name}: {out['real_tokens_per_s']:,.0f} real tokens/s, {steps} steps",
          file=sys.stderr, flush=True)
    return out


def options(ap: argparse.ArgumentParser) -> None:
    """The model, the data, the batch shapes, the loader."""
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--docs", type=int, default=30000, help="documents in the dataset (default 30000)")
    ap.add_argument("--mu", type=float, default=5.3, help="lognormal mu of document lengths (default 5.3)")
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma (default 1.0)")
    ap.add_argument("--max-len", type=int, default=2048, help="longest document (default 2048)")
    ap.add_argument("--seq-len", type=int, default=2048, help="packed row length L (default 2048)")
    ap.add_argument("--rows", type=int, default=8, help="packed rows per step R (default 8)")
    ap.add_argument("--tokens", type=int, default=1_500_000, help="real tokens timed per config")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per config (default 3)")
    ap.add_argument("--workers", type=int, default=4, help="loader workers (default 4)")
    ap.add_argument("--attention", choices=["auto", *IMPLS], default="auto", help="varlen attention")
    ap.add_argument("--sdpa", choices=["no-cudnn", "default"], default="no-cudnn",
                    help="padded SDPA: cuDNN attention off (default) or torch's choice")
    ap.add_argument("--data", default="/tmp/fastfeed-gpu-tokens", help="where the dataset is built")


def run(ctx: Context) -> dict[str, Any]:
    """The data built, the attention probed; every batch kind of the grid, then the table."""
    args = ctx.args
    if args.max_len > args.seq_len * args.rows:
        raise SystemExit("--max-len must be <= --seq-len x --rows (the token budget must fit every document)")

    device = torch.device(args.device)
    if device.type == "cpu":  # leave the loader workers their cores: spinning intra-op threads slow both
        torch.set_num_threads(max(1, (os.cpu_count() or 1) - args.workers))
    if device.type == "cuda" and args.sdpa == "no-cudnn":
        torch.backends.cuda.enable_cudnn_sdp(False)
    dst = build_data(args)
    from fastfeed.packed.index import DatasetIndex
    from fastfeed.sampling.samplers import DistributedTokenBudgetSampler

    lengths = np.asarray(DatasetIndex.load(dst).lengths)
    mean = float(lengths.mean())
    per_step = args.rows * args.seq_len
    B = max(1, round(per_step / mean))
    step = Step(args, device)
    tried = probe_attention(step, args.attention)
    pin = device.type == "cuda"
    common = {"workers": args.workers, "pin_memory": pin, "drop_last": True}

    def sampler() -> Any:
        return DistributedTokenBudgetSampler(str(dst), max_cost=per_step, num_replicas=1, rank=0)

    loaders = {
        "packed": (lambda: fastfeed_loader(dst, batch_size=args.rows, seq_len=args.seq_len, **common), step.packed),
        "padded": (lambda: fastfeed_loader(dst, batch_size=B, pad_multiple=8, **common), step.padded),
        "budget": (lambda: fastfeed_loader(dst, batch_sampler=sampler(), pad_multiple=8, workers=args.workers,
                                           pin_memory=pin), step.padded),
        "budget-varlen": (lambda: fastfeed_loader(dst, batch_sampler=sampler(), workers=args.workers,
                                                  pin_memory=pin), step.unpadded),
    }
    names = list(ctx.grid["config"])
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"gpu_tokens: {dev_name} | torch {torch.__version__} | {args.layers}x{args.d_model}, {args.heads} heads | "
          f"varlen attention: {ATTN['impl']} ({'; '.join(tried)}) | padded SDPA: {args.sdpa} | "
          f"{len(lengths):,} docs, mean {mean:.0f} tokens | packed {args.rows}x{args.seq_len}, padded batch {B}, "
          f"budget {per_step} padded tokens | {args.tokens:,} real tokens per config", flush=True)
    rows = []
    for name in names:
        make, fn = loaders[name]
        dl = make()
        rows.append(run_config(name, lambda: iter(dl), fn, step, args))
        del dl
    base = next((r["real_tokens_per_s"] for r in rows if r["config"] == "padded"), None)
    print(f"{'config':<15}{'real tok/s':>12}{'computed tok/s':>16}{'pad eff.':>9}{'real/step':>10}{'step ms':>9}"
          f"{'loader wait':>12}{'vs padded':>10}")
    for r in rows:
        r["speedup_vs_padded"] = r["real_tokens_per_s"] / base if base else None
        vs = f"{r['speedup_vs_padded']:.2f}x" if base else "-"
        print(f"{r['config']:<15}{r['real_tokens_per_s']:>12,.0f}{r['computed_tokens_per_s']:>16,.0f}"
              f"{r['padding_efficiency']:>9.3f}{r['real_tokens_per_step']:>10,.0f}{r['step_ms']:>9.1f}"
              f"{r['loader_wait_share']:>12.1%}{vs:>10}")
    out = {"gpu_tokens": {"device": dev_name, "torch": torch.__version__, "varlen_attention": ATTN["impl"],
                          "probe": tried, "padded_batch": B, "mean_len": mean,
                          "args": {k: str(v) for k, v in vars(args).items() if k != "point"}, "rows": rows}}
    return out


BENCHMARK = Benchmark(
    name="gpu_tokens", doc=__doc__, options=options, run=run,
    grid=(Axis("config", ("packed", "padded", "budget", "budget-varlen"), flag="--configs",
               help="the batch kinds (see the table above)"),),
    quick={"device": "cpu", "layers": 2, "d_model": 64, "heads": 4, "vocab": 1024, "docs": 2000, "max_len": 256,
           "seq_len": 256, "rows": 4, "tokens": 40_000, "workers": 1},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
