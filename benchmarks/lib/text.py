"""Text data of the text benchmarks (issue 19): a parquet corpus, a BPE tokenizer, both packs.

Used by ``benchmarks/pack_text.py`` and ``benchmarks/loader_text.py``; everything is made at run time under
``bench-data/`` (no download) and reused while its recipe is unchanged:

- :func:`text_parquet`: ``text-<rows>.parquet``, columns ``id`` (string) and ``text``.
  ``shared/data`` holds no corpus of running text (its only text is 1000 short product
  strings in a webdataset test tar), so the text is generated: a vocabulary of 50,000
  pronounceable pseudo-words drawn with Zipf frequencies (``p(rank) ~ 1/rank^1.1``, as words
  of real text are), in sentences of 4-40 words (capital letter, commas, a full stop; some
  numbers), in paragraphs of 1-8 sentences. Document lengths in words are lognormal
  (``mu=4.8, sigma=1.1``: median ~120 words, mean ~220, a long tail to ~20,000, clamped
  at 8), the shape of web documents (C4 and FineWeb are close to lognormal). Row groups of
  5,000 rows (several per file, so pack can split the work), snappy (pyarrow's default).
- :func:`text_tokenizer`: a byte-level BPE (GPT-2 style pre-tokenizer, 16,384 tokens so ids
  fit uint16, ``<pad>`` and ``<|endoftext|>`` special tokens) trained with ``tokenizers`` on
  the first 5,000 documents.
- :func:`fastfeed_pack` / :func:`hf_save`: the pack of that parquet with
  ``fastfeed pack --tokenizer --tokenize text`` and the HF ``load_dataset("parquet")`` ->
  ``map(tokenizer)`` -> ``save_to_disk`` output (``loader_text.py`` reads both; the
  timed runs of ``pack_text.py`` write their own).

Example:
    >>> pq = text_parquet(2_000)                   # doctest: +SKIP
    >>> tok = text_tokenizer(pq)                   # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib.data import BENCH_DATA, publish, recipe_ready
from benchmarks.lib.report import log

__all__ = ["TEXT_RECIPE", "fastfeed_pack", "hf_save", "hf_tokenizer", "text_parquet", "text_tokenizer"]

TEXT_RECIPE = {"vocab_words": 50_000, "zipf": 1.1, "mu": 4.8, "sigma": 1.1, "min_words": 8,
               "max_words": 20_000, "row_group": 5_000, "seed": 0, "version": 1}
TOKENIZER_RECIPE = {"vocab_size": 16_384, "train_docs": 5_000, "kind": "byte-level-bpe", "version": 1}
_SYLLABLES = [c + v for c in ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t",
                               "v", "w", "st", "tr", "ch", "th", "sh", "pr", "gr"]
              for v in ["a", "e", "i", "o", "u", "ou", "ea", "ai", "er", "an", "in", "on", "en", "al"]]


def _vocabulary(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` distinct pseudo-words, short ones first (frequent words are short in real text)."""
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n:
        k = 1 + min(4, int(rng.poisson(0.4 + 2.2 * len(words) / n)))  # 1-5 syllables, longer for rarer
        w = "".join(_SYLLABLES[i] for i in rng.integers(0, len(_SYLLABLES), k))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return np.array(words, dtype=object)


def _documents(rows: int, seed: int) -> list[str]:
    r = TEXT_RECIPE
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(r["vocab_words"], rng)
    p = 1.0 / np.arange(1, len(vocab) + 1) ** r["zipf"]
    cdf = np.cumsum(p / p.sum())
    n_words = np.clip(rng.lognormal(r["mu"], r["sigma"], rows), r["min_words"], r["max_words"]).astype(np.int64)
    ids = np.minimum(np.searchsorted(cdf, rng.random(int(n_words.sum()))), len(vocab) - 1)
    words = vocab[ids]
    numbers = rng.random(len(words)) < 0.01  # ~1% numbers, years and counts
    words[numbers] = rng.integers(1, 3000, int(numbers.sum())).astype(str)
    docs: list[str] = []
    at = 0
    for n in n_words.tolist():
        w = words[at:at + n].tolist()
        at += n
        out, i, in_para = [], 0, 0
        while i < n:
            s = min(n - i, int(rng.integers(4, 41)))
            sent = w[i:i + s]
            sent[0] = sent[0].capitalize()
            if s > 8 and rng.random() < 0.5:
                c = int(rng.integers(2, s - 2))
                sent[c] = sent[c] + ","
            out.append(" ".join(sent) + ".")
            i += s
            in_para += 1
            if i < n and in_para >= int(rng.integers(1, 9)):
                out.append("\n\n")
                in_para = 0
        docs.append(" ".join(out).replace(" \n\n ", "\n\n"))
    return docs


def text_parquet(rows: int) -> Path:
    """``bench-data/text-<rows>.parquet`` (see the module docstring), made once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    recipe = {"kind": "text-parquet", "rows": rows, **TEXT_RECIPE}
    path = BENCH_DATA / f"text-{rows}.parquet"
    if recipe_ready(path, recipe):
        return path
    BENCH_DATA.mkdir(parents=True, exist_ok=True)
    docs = _documents(rows, TEXT_RECIPE["seed"])
    table = pa.table({"id": [f"doc{i:08d}" for i in range(rows)], "text": docs})
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, row_group_size=TEXT_RECIPE["row_group"])
    log(f"wrote {path.name}: {rows} rows, {tmp.stat().st_size / 1e6:.0f} MB")
    return publish(tmp, path, recipe)


def text_tokenizer(parquet: Path) -> Path:
    """A byte-level BPE tokenizer JSON trained on the first documents of ``parquet``, made once."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    r = TOKENIZER_RECIPE
    recipe = {"kind": "tokenizer", "source": parquet.name, **r}
    path = BENCH_DATA / f"{parquet.stem}-bpe{r['vocab_size']}.json"
    if recipe_ready(path, recipe):
        return path
    texts = pq.read_table(parquet, columns=["text"]).column("text").to_pylist()[: r["train_docs"]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=r["vocab_size"], special_tokens=["<pad>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tmp = path.with_name(path.name + ".tmp")
    tok.save(str(tmp))
    return publish(tmp, path, recipe)


def hf_tokenizer(tok_json: Path) -> Any:
    """``transformers.PreTrainedTokenizerFast`` around the ``tokenizers`` object (pad ``<pad>``)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(tok_json)), pad_token="<pad>")


def fastfeed_pack_to(parquet: Path, tok_json: Path, out: Path, workers: int | str) -> int:
    """``fastfeed pack PARQUET OUT --tokenizer TOK --tokenize text --workers N`` (the CLI's own
    ``main``, in this process); returns its exit status."""
    from fastfeed.cli import main

    return main(["pack", str(parquet), str(out), "--tokenizer", str(tok_json), "--tokenize", "text",
                 "--workers", str(workers)])


def hf_save_to(parquet: Path, tok_json: Path, out: Path, workers: int, cache: Path) -> Any:
    """The HF way: ``load_dataset("parquet")`` -> ``map(tokenize, batched=True, num_proc)`` ->
    ``save_to_disk``, with its caches in ``cache`` (a fresh folder: no run reuses another's)."""
    import datasets

    datasets.disable_progress_bars()
    tok = hf_tokenizer(tok_json)

    def tokenize(batch: dict[str, list[str]]) -> dict[str, Any]:
        return {"input_ids": tok(batch["text"], return_attention_mask=False)["input_ids"]}

    ds = datasets.load_dataset("parquet", data_files=str(parquet), split="train", cache_dir=str(cache))
    ds = ds.map(tokenize, batched=True, num_proc=workers if workers > 1 else None)
    ds.save_to_disk(str(out), num_proc=workers if workers > 1 else None)
    return ds


def fastfeed_pack(parquet: Path, tok_json: Path) -> Path:
    """The fastfeed pack of ``parquet`` for the loader benchmark, made once."""
    recipe = {"kind": "ff-text", "parquet": parquet.name, "tokenizer": tok_json.name}
    out = parquet.with_name(parquet.stem + ".ff")
    if recipe_ready(out, recipe):
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if fastfeed_pack_to(parquet, tok_json, tmp, "auto") != 0:
        raise SystemExit(f"fastfeed pack {parquet} failed")
    return publish(tmp, out, recipe)


def hf_save(parquet: Path, tok_json: Path) -> Path:
    """The HF ``save_to_disk`` folder of ``parquet`` for the loader benchmark, made once."""
    recipe = {"kind": "hf-text", "parquet": parquet.name, "tokenizer": tok_json.name}
    out = parquet.with_name(parquet.stem + ".hf")
    if recipe_ready(out, recipe):
        return out
    tmp = out.with_name(out.name + ".tmp")
    cache = out.with_name(out.name + ".cache")
    shutil.rmtree(tmp, ignore_errors=True)
    hf_save_to(parquet, tok_json, tmp, os.cpu_count() or 1, cache)
    shutil.rmtree(cache, ignore_errors=True)
    return publish(tmp, out, recipe)
