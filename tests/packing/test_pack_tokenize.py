"""``pack --tokenizer``: token ids stored, exact lengths, pad id in the index, every input kind, errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import fastfeed
from _pack_data import tree_digest
from fastfeed.cli import main
from fastfeed.errors import ConfigError, DestinationError, SourceError
from fastfeed.packed.index import DatasetIndex
from fastfeed.packing.plan import plan_pack
from fastfeed.packing.write import write_shard
from tools.synth import make_jpeg

TEXTS = [f"the quick brown fox {i} jumps over the lazy dog {'again ' * (i % 4)}".strip() for i in range(11)]


def _train(path: Path, vocab_size: int = 45, extra: int = 0) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]"]))
    if extra:  # push the vocabulary past 65536 ids: stored ids become uint32
        tok.add_tokens([f"tok{i}" for i in range(extra)])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


@pytest.fixture()
def tok_file(tmp_path: Path) -> Path:
    return _train(tmp_path / "tok" / "tokenizer.json")


@pytest.fixture()
def table(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "src" / "docs.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"text": TEXTS, "pic": [make_jpeg(rng, (8, 8)) for _ in TEXTS]}), path,
                   row_group_size=4)
    return path


def _ids(tok_file: Path, text: str) -> list[int]:
    return tokenizers.Tokenizer.from_file(str(tok_file)).encode(text).ids


def _stored(dst: Path) -> list[dict]:
    """Every sample as the loader yields it, in index (stored) order."""
    return [dict(zip(b, vals)) for b in fastfeed.loader(dst, batch_size=4, shuffle=False, decode=None, num_workers=0)
            for vals in zip(*b.values())]


def _rows(dst: Path) -> list[dict]:
    """:func:`_stored` sorted by key (row numbers: row order)."""
    return sorted(_stored(dst), key=lambda r: r["__key__"])


def test_parquet_tokens_and_exact_lengths(table: Path, tok_file: Path, tmp_path: Path) -> None:
    idx = fastfeed.pack(table, tmp_path / "ff", tokenizer=tok_file.parent, tokenize="text", samples_per_shard=4)
    want = [_ids(tok_file, t) for t in TEXTS]
    stored = [int(r["__key__"]) for r in _stored(tmp_path / "ff")]
    assert idx.lengths is not None and idx.lengths.tolist() == [len(want[i]) for i in stored]
    assert idx.lengths_field == "text" and "tokens.npy" in idx.fields
    meta = DatasetIndex.load(tmp_path / "ff").tokenizer
    assert meta is not None and meta["pad_id"] == 0 and meta["dtype"] == "uint16" and meta["tokens"] == "tokens.npy"
    assert meta["vocab_size"] == tokenizers.Tokenizer.from_file(str(tok_file)).get_vocab_size(with_added_tokens=True)
    rows = _rows(tmp_path / "ff")
    for row, ids, text in zip(rows, want, TEXTS):
        arr = np.load(io.BytesIO(row["tokens.npy"]), allow_pickle=False)
        assert arr.dtype == np.uint16 and arr.tolist() == ids and row["text"] == text.encode()


def test_info_shows_the_tokenizer(table: Path, tok_file: Path, tmp_path: Path, capsys) -> None:
    from fastfeed.packed.checks import info

    fastfeed.pack(table, tmp_path / "ff", tokenizer=tok_file, tokenize="text")
    vocab = tokenizers.Tokenizer.from_file(str(tok_file)).get_vocab_size(with_added_tokens=True)
    total = sum(len(_ids(tok_file, t)) for t in TEXTS)
    t = info(tmp_path / "ff")["tokenizer"]
    assert (t["vocab_size"], t["dtype"], t["pad_id"], t["total_tokens"], t["tokens"]) == (
        vocab, "uint16", 0, total, "tokens.npy")
    assert main(["info", str(tmp_path / "ff")]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("tokenizer")]
    assert line == [f"  tokenizer  {t['field']} (ids in tokens.npy): vocab {vocab}, uint16, pad id 0, {total} tokens"]
    fastfeed.pack(table, tmp_path / "plain")
    assert "tokenizer" not in info(tmp_path / "plain")


def test_uint32_for_a_large_vocabulary(table: Path, tmp_path: Path) -> None:
    big = _train(tmp_path / "big.json", extra=66_000)
    fastfeed.pack(table, tmp_path / "ff", tokenizer=big, tokenize="text")
    arr = np.load(io.BytesIO(_rows(tmp_path / "ff")[0]["tokens.npy"]), allow_pickle=False)
    assert arr.dtype == np.uint32 and arr.tolist() == _ids(big, TEXTS[0])
    assert DatasetIndex.load(tmp_path / "ff").tokenizer["dtype"] == "uint32"


def test_length_only_counts_tokens_jsonl_and_cli(tmp_path: Path, tok_file: Path, capsys) -> None:
    man = tmp_path / "m" / "data.jsonl"
    man.parent.mkdir()
    man.write_text("".join(json.dumps({"__key__": f"s{i:02d}", "caption": t}) + "\n" for i, t in enumerate(TEXTS)))
    rc = main(["pack", str(man), str(tmp_path / "ff"), "--tokenizer", str(tok_file), "--length", "caption",
               "--no-shuffle"])
    out = capsys.readouterr().out
    want = [len(_ids(tok_file, t)) for t in TEXTS]
    assert rc == 0 and f"{sum(want)} tokens of caption.txt" in out and "counted only" in out
    idx = DatasetIndex.load(tmp_path / "ff")
    assert idx.lengths.tolist() == want and "tokens.npy" not in idx.fields
    assert idx.tokenizer["tokens"] is None and idx.lengths.tolist() != [len(t.split()) for t in TEXTS]


def test_file_tree_text_fields_and_workers(tmp_path: Path, tok_file: Path) -> None:
    src = tmp_path / "tree"
    src.mkdir()
    for i, t in enumerate(TEXTS):
        (src / f"{i:03d}.txt").write_text(t)
    a = fastfeed.pack(src, tmp_path / "a", tokenizer=tok_file, tokenize="txt", samples_per_shard=3)
    fastfeed.pack(src, tmp_path / "b", tokenizer=tok_file, tokenize="txt", samples_per_shard=3, workers=2)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")  # deterministic, any worker count
    by_key = {r["__key__"]: np.load(io.BytesIO(r["tokens.npy"])).tolist() for r in _rows(tmp_path / "a")}
    assert by_key == {f"{i:03d}": _ids(tok_file, t) for i, t in enumerate(TEXTS)}
    keys = [r["__key__"] for r in _stored(tmp_path / "a")]
    assert a.lengths.tolist() == [len(_ids(tok_file, TEXTS[int(k)])) for k in keys]


def test_new_tokenizer_repacks_and_rerun_reuses(table: Path, tok_file: Path, tmp_path: Path) -> None:
    dst = tmp_path / "ff"
    plan = plan_pack(table, dst, tokenizer=tok_file, tokenize="text", samples_per_shard=4)
    first = write_shard(plan, 0)
    again = plan_pack(table, dst, tokenizer=tok_file, tokenize="text", samples_per_shard=4)
    assert write_shard(again, 0).reused and write_shard(again, 0).sha256 == first.sha256
    other = _train(tmp_path / "other.json", vocab_size=40)
    changed = plan_pack(table, tmp_path / "ff2", tokenizer=other, tokenize="text", samples_per_shard=4)
    assert changed.job != plan.job and changed.content != plan.content
    with pytest.raises(DestinationError, match="unfinished run of another job"):
        plan_pack(table, dst, tokenizer=other, tokenize="text", samples_per_shard=4)


def test_bad_tokenizer_options(table: Path, tok_file: Path, tmp_path: Path) -> None:
    dst = tmp_path / "ff"
    with pytest.raises(ConfigError, match="--tokenize text2: .* has no column 'text2'.*the text columns: text"):
        fastfeed.pack(table, dst, tokenizer=tok_file, tokenize="text2")
    with pytest.raises(ConfigError, match=r"column 'pic' .* is packed as bytes.*not text.*--columns pic=txt"):
        fastfeed.pack(table, dst, tokenizer=tok_file, tokenize="pic")
    (tmp_path / "broken.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(ConfigError, match=r"broken.json: not a tokenizers JSON file"):
        fastfeed.pack(table, dst, tokenizer=tmp_path / "broken.json", tokenize="text")
    with pytest.raises(ConfigError, match="no such file"):
        fastfeed.pack(table, dst, tokenizer=tmp_path / "missing.json", tokenize="text")
    with pytest.raises(ConfigError, match="needs a tokenizer"):
        fastfeed.pack(table, dst, tokenize="text")
    with pytest.raises(ConfigError, match="--tokenizer needs --tokenize FIELD"):
        fastfeed.pack(table, dst, tokenizer=tok_file)
    with pytest.raises(ConfigError, match="leave --length out"):
        fastfeed.pack(table, dst, tokenizer=tok_file, tokenize="text", length="pic")
    assert not dst.exists() or not (dst / "index.json").exists()


def test_sample_without_the_text_field(tmp_path: Path, tok_file: Path) -> None:
    src = tmp_path / "tree"
    src.mkdir()
    (src / "a.txt").write_text(TEXTS[0])
    (src / "b.txt").write_text(TEXTS[1])
    (src / "c.json").write_text("{}")
    with pytest.raises(SourceError, match=r"sample 'c' has no field 'txt'.*--on-error skip"):
        fastfeed.pack(src, tmp_path / "a", tokenizer=tok_file, tokenize="txt")
    idx = fastfeed.pack(src, tmp_path / "b", tokenizer=tok_file, tokenize="txt", on_error="skip")
    assert idx.num_samples == 2 and [s["key"] for s in idx.skipped] == ["c"]
    with pytest.raises(ConfigError, match=r"--tokenize json: the field 'json' .* is packed as json, not text"):
        fastfeed.pack(src, tmp_path / "c", tokenizer=tok_file, tokenize="json")


def test_existing_tokens_field_is_refused(tmp_path: Path, tok_file: Path) -> None:
    src = tmp_path / "tree"
    src.mkdir()
    (src / "a.txt").write_text(TEXTS[0])
    np.save(src / "a.tokens.npy", np.arange(3))
    with pytest.raises(ConfigError, match=r"already has a field tokens.npy"):
        fastfeed.pack(src, tmp_path / "ff", tokenizer=tok_file, tokenize="txt")
    idx = fastfeed.pack(src, tmp_path / "ok", tokenizer=tok_file, length="txt")  # counting only: no clash
    assert idx.lengths.tolist() == [len(_ids(tok_file, TEXTS[0]))]
