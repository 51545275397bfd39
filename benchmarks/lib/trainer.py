"""The transformer and the DDP training step of ``benchmarks/ddp_tokens.py``.

A transformer encoder (``--layers`` x ``--width``, ``--heads`` heads; bf16 autocast on a GPU)
trained on random tokens of given lengths, padded (``[n, longest]``, SDPA without a key mask: a
throughput benchmark) or packed (all sequences of a batch end to end, attention per sequence from
the offsets: flash-attention's ``varlen_attn``, jagged nested tensors, or one SDPA per group of
equal lengths, whichever :func:`probe_varlen` finds running here). :class:`Trainer` runs one step
without host synchronisation and records, per step, when compute ended, when the slowest rank
arrived (a 1-element all_reduce) and when the gradient all_reduce and the optimizer were done.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.lib.measure import Stopwatch

__all__ = ["VARLEN", "Block", "Encoder", "Trainer", "length_groups", "micro_batches", "probe_varlen",
           "sdpa_backend_name", "sdpa_setup_probe"]

#: varlen attention: "flash" (varlen_attn), "nested" (jagged nested tensors) or "groups" (per-length SDPA)
VARLEN: dict[str, Any] = {"impl": "nested", "groups": None}

#: (offsets on the device: int64 for nested tensors, int32 for varlen_attn; shortest; longest) of a packed batch
Packed = tuple[torch.Tensor, int, int]


# ----------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attend(self, h: torch.Tensor, packed: Packed | None) -> torch.Tensor:
        H = self.heads
        if packed is None:  # padded [n, L, 3d]
            n, L, _ = h.shape
            q, k, v = h.view(n, L, 3, H, -1).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, L, -1)
        offsets, lo, hi = packed
        T = h.shape[0]
        if VARLEN["impl"] == "flash":  # flash-attention varlen kernel on [T, H, D] + cu_seqlens
            from torch.nn.attention.varlen import varlen_attn

            q, k, v = h.view(T, 3, H, -1).unbind(1)
            return varlen_attn(q, k, v, offsets, offsets, hi, hi).reshape(T, -1)
        parts = [p.contiguous() for p in h.view(T, 3, H, -1).unbind(1)]  # q, k, v: [T, H, D]
        if VARLEN["groups"] is None:  # packed [T, 3d] + cu_seqlens: jagged nested tensors
            # min/max given: otherwise each layer's SDPA computes them with a host sync
            q, k, v = (torch.nested.nested_tensor_from_jagged(p, offsets, min_seqlen=lo, max_seqlen=hi)
                       .transpose(1, 2) for p in parts)
            o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
            return o.values().reshape(T, -1)
        out = torch.empty_like(parts[0])  # fallback: one SDPA per group of equal-length sequences
        for L, idx in VARLEN["groups"]:
            q, k, v = (p[idx].view(-1, L, H, p.shape[-1]).transpose(1, 2) for p in parts)
            out[idx] = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(-1, H, out.shape[-1])
        return out.reshape(T, -1)

    def forward(self, x: torch.Tensor, packed: Packed | None) -> torch.Tensor:
        x = x + self.proj(self.attend(self.qkv(self.ln1(x)), packed))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Encoder(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, packed: Packed | None) -> torch.Tensor:
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x, packed)
        return self.head(self.ln(x))


# ----------------------------------------------------------------------------- training step
def micro_batches(lengths: np.ndarray, varlen: bool, max_tokens: int) -> list[slice]:
    """Even row chunks of at most ``max_tokens`` tokens each (padded to the batch's longest, or packed)."""
    n = len(lengths)
    total = int(lengths.sum()) if varlen else n * int(lengths.max())
    chunks = max(1, -(-total // max_tokens))
    if chunks == 1:
        return [slice(0, n)]
    if not varlen:
        rows = -(-n // chunks)
        return [slice(i, i + rows) for i in range(0, n, rows)]
    cuts = np.searchsorted(np.cumsum(lengths), np.arange(1, chunks) * total / chunks)  # ~equal tokens
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 1, n - 1), [n]]))
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


class Trainer:
    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.args, self.device = args, device
        torch.manual_seed(0)
        self.model = Encoder(args.vocab, args.width, args.layers, args.heads).to(device)
        for p in self.model.parameters():  # identical start on every rank
            dist.broadcast(p.data, 0)
        self.params = [p for p in self.model.parameters()]
        self.opt = torch.optim.AdamW(self.params, lr=1e-4)
        self.cuda = device.type == "cuda"
        self.records: list[tuple[Any, ...]] = []
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(1234 + dist.get_rank())
        self.barrier_token = torch.zeros(1, device=device)
        self.clock = Stopwatch.start()  # the host's timeline (and the steps' on CPU)

    def _now(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self.clock.elapsed()

    def _to_device(self, a: np.ndarray, dtype: Any = np.int64) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))
        if self.cuda:  # pinned + non_blocking: no host sync, the CPU keeps queueing ahead
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _loss(self, ls: np.ndarray, L: int, varlen: bool, real: int) -> torch.Tensor:
        a, dev = self.args, self.device
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.cuda):
            if varlen:
                tokens = torch.randint(0, a.vocab, (int(ls.sum()),), device=dev, generator=self.gen)
                offsets = self._to_device(np.concatenate([[0], np.cumsum(ls)]),
                                          np.int32 if VARLEN["impl"] == "flash" else np.int64)
                VARLEN["groups"] = length_groups(ls, dev) if VARLEN["impl"] == "groups" else None
                logits = self.model(tokens, (offsets, int(ls.min()), int(ls.max())))
                return F.cross_entropy(logits.float(), tokens, reduction="sum") / real
            tokens = torch.randint(0, a.vocab, (len(ls), L), device=dev, generator=self.gen)
            keep = torch.arange(L, device=dev)[None, :] < self._to_device(ls)[:, None]
            logits = self.model(tokens, None)
            target = tokens.masked_fill(~keep, -100).view(-1)
            return F.cross_entropy(logits.float().view(-1, a.vocab), target, reduction="sum") / real

    def step(self, lengths: np.ndarray, varlen: bool, record: bool = True) -> None:
        lengths = np.asarray(lengths, dtype=np.int64)
        n, L, real = len(lengths), int(lengths.max()), int(lengths.sum())
        h0 = self.clock.elapsed()
        t0 = self._now()
        for part in micro_batches(lengths, varlen, self.args.max_micro_tokens):
            self._loss(lengths[part], L, varlen, real).backward()  # every chunk padded to the batch's L
        t1 = self._now()
        host = self.clock.elapsed() - h0  # the CPU's time to queue forward + backward
        dist.all_reduce(self.barrier_token)  # returns when the slowest rank has arrived
        t2 = self._now()
        grads = [p.grad for p in self.params]
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for g, s in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(s)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        t3 = self._now()
        if record:
            self.records.append((t0, t1, t2, t3, n, L, real, int((lengths * lengths).sum()), host))

    def timings(self) -> dict[str, Any]:
        """Per measured step (seconds): compute, barrier wait, comm + optimizer, cycle; and the batch features."""
        recs = self.records
        if self.cuda:
            torch.cuda.synchronize()

            def el(a: Any, b: Any) -> float:
                return a.elapsed_time(b) / 1000.0
        else:
            def el(a: Any, b: Any) -> float:
                return b - a
        cycle = [el(recs[k][0], recs[k + 1][0]) for k in range(len(recs) - 1)] + [el(recs[-1][0], recs[-1][3])]
        return {"compute": [el(r[0], r[1]) for r in recs], "wait": [el(r[1], r[2]) for r in recs],
                "comm": [el(r[2], r[3]) for r in recs], "cycle": cycle,
                "n": [r[4] for r in recs], "max": [r[5] for r in recs], "sum": [r[6] for r in recs],
                "sumsq": [r[7] for r in recs], "host": [r[8] for r in recs]}


def length_groups(lengths: np.ndarray, dev: torch.device) -> list[tuple[int, torch.Tensor]]:
    """Token positions of the sequences of each distinct length, for the fallback."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    out = []
    for L in np.unique(lengths):
        s = starts[lengths == L]
        out.append((int(L), torch.from_numpy((s[:, None] + np.arange(L)).ravel()).to(dev)))
    return out


def probe_varlen(trainer: "Trainer", wanted: str) -> None:
    """Pick the varlen attention: ``wanted`` if a forward + backward runs here, else the next fallback.

    ``auto`` tries flash (``varlen_attn``, CUDA only), then nested tensors, then per-length groups.
    All ranks probe the same batch and agree on the first implementation that runs on every rank.
    """
    order = {"auto": ["flash", "nested", "groups"], "flash": ["flash"], "nested": ["nested", "groups"]}[wanted]
    if not trainer.cuda and "flash" in order and len(order) > 1:
        order.remove("flash")
    for impl in order:
        VARLEN["impl"] = impl
        ok, why = True, ""
        try:
            trainer.step(np.array([5, 9, 3]), varlen=True, record=False)
        except (RuntimeError, NotImplementedError, ImportError, AttributeError, TypeError) as e:
            ok, why = False, str(e).splitlines()[0] if str(e) else type(e).__name__
            trainer.opt.zero_grad(set_to_none=True)
        everyone = torch.tensor([int(ok)], device=trainer.device)
        dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
        if everyone.item():
            break
        if dist.get_rank() == 0:
            print(f"varlen attention: {impl} unavailable here ({why or 'on another rank'})", flush=True)
    else:
        raise SystemExit(f"varlen attention: none of {order} runs a forward + backward here")
    if dist.get_rank() == 0:
        print(f"varlen attention: {VARLEN['impl']}", flush=True)


# ----------------------------------------------------------------------------- attention backend
def sdpa_backend_name(args: argparse.Namespace, device: torch.device) -> str:
    """The backend torch's SDPA dispatch picks for this model's padded attention."""
    from torch.nn.attention import SDPBackend

    names = {v.value: k.lower() for k, v in SDPBackend.__members__.items()}
    h = torch.zeros(2, 100, 3, args.heads, args.width // args.heads, device=device,
                    dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    q, k, v = h.permute(2, 0, 3, 1, 4)
    try:
        return names.get(int(torch._fused_sdp_choice(q, k, v)), "unknown")
    except (RuntimeError, AttributeError, TypeError) as e:
        return f"unknown ({type(e).__name__})"


def sdpa_setup_probe(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """SDPA forward + backward on fresh shapes (this model's layouts): first call vs cached call.

    Per backend (cuDNN, flash) and layout (padded [n, L]; packed = jagged nested tensor with
    its min/max length given), the median over four new shapes, in ms. A first call much
    slower than the cached one is a per-shape setup (a plan build) that length-aware
    batching would pay on nearly every step.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, D = args.heads, args.width // args.heads

    def padded(n: int, L: int) -> Callable[[], None]:
        h = torch.randn(n, L, 3, H, D, device=device, dtype=torch.bfloat16, requires_grad=True)

        def run() -> None:
            q, k, v = h.permute(2, 0, 3, 1, 4)
            F.scaled_dot_product_attention(q, k, v).float().sum().backward()
        return run

    def packed(n: int, L: int) -> Callable[[], None]:
        ls = np.array([L - 7 * i for i in range(n)])
        off = torch.from_numpy(np.concatenate([[0], np.cumsum(ls)])).to(device)
        h = torch.randn(int(ls.sum()), 3, H, D, device=device, dtype=torch.bfloat16, requires_grad=True)

        def run() -> None:
            q, k, v = (torch.nested.nested_tensor_from_jagged(p.contiguous(), off, min_seqlen=int(ls.min()),
                                                             max_seqlen=int(ls.max())).transpose(1, 2)
                       for p in h.unbind(1))
            F.scaled_dot_product_attention(q, k, v).values().float().sum().backward()
        return run

    out: dict[str, Any] = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        for layout, make in (("padded", padded),):  # packed + cuDNN: illegal memory access (torch 2.11)
            first, again = [], []
            try:
                with sdpa_kernel([backend]):
                    for n, L in ((3, 301), (5, 517), (2, 777), (7, 203)):
                        run = make(n, L)
                        for times in (first, again):
                            torch.cuda.synchronize()
                            with Stopwatch() as took:
                                run()
                                torch.cuda.synchronize()
                            times.append(took.wall)
            except (RuntimeError, NotImplementedError) as e:
                out[f"{name}-{layout}"] = {"error": str(e).splitlines()[0][:160]}
                continue
            out[f"{name}-{layout}"] = {"first_ms": round(1000 * float(np.median(first)), 3),
                                       "cached_ms": round(1000 * float(np.median(again)), 3)}
    return out
