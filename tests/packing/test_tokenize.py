"""A real tokenizer at pack time: load (file, folder, errors), encode per shard, exact lengths, workers."""

from __future__ import annotations

import json
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")

from fastfeed.decode.fields import decode_field
from fastfeed.errors import BadFileError, ConfigError, SourceError
from fastfeed.packing.content.tokenize import (
    TOKENS_FIELD,
    Tokenizer,
    check_tokenize_field,
    load_tokenizer,
    tokenize_samples,
)

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "a lazy dog sleeps all day in the sun",
    "pack the text once and train on tokens many times",
    "tokens are counted exactly, not as whitespace words",
] * 5


def _train(folder: Path, *, pad: str | None = "[PAD]", vocab_size: int = 300) -> Path:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = [s for s in (pad, "[UNK]", "[BOS]") if s]
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture()
def tok_file(tmp_path: Path) -> Path:
    return _train(tmp_path / "tok")


def test_load_file_and_folder(tok_file: Path) -> None:
    ref = tokenizers.Tokenizer.from_file(str(tok_file))
    for path in (tok_file, tok_file.parent):
        tok = load_tokenizer(path)
        assert tok.path == str(tok_file) and tok.dtype == "uint16"
        assert tok.vocab_size == ref.get_vocab_size(with_added_tokens=True)
        assert tok.pad_id == ref.token_to_id("[PAD]")
        assert len(tok.sha256) == 64
    assert load_tokenizer(tok_file).index_meta() == {
        "sha256": tok.sha256, "vocab_size": tok.vocab_size, "pad_id": tok.pad_id, "dtype": "uint16"}


def test_pad_id_sources(tmp_path: Path) -> None:
    path = _train(tmp_path / "nopad", pad=None)
    assert load_tokenizer(path).pad_id is None
    (tmp_path / "nopad" / "tokenizer_config.json").write_text(json.dumps({"pad_token": {"content": "[BOS]"}}))
    ref = tokenizers.Tokenizer.from_file(str(path))
    assert load_tokenizer(tmp_path / "nopad").pad_id == ref.token_to_id("[BOS]")  # the folder's config
    ref.enable_padding(pad_id=ref.token_to_id("[UNK]"), pad_token="[UNK]")
    ref.save(str(tmp_path / "padded.json"))
    assert load_tokenizer(tmp_path / "padded.json").pad_id == ref.token_to_id("[UNK]")


def test_large_vocabulary_is_uint32(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)}
    tok = HFTokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "big.json"))
    big = load_tokenizer(tmp_path / "big.json")
    assert big.dtype == "uint32" and big.vocab_size == 70_000
    out = tokenize_samples(big, [("k", {"txt": b"w1 w69999 w65536"})], "txt")
    ids = decode_field(TOKENS_FIELD, out.fields[0][TOKENS_FIELD])
    assert ids.dtype == np.uint32 and ids.tolist() == [1, 69999, 65536]


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file .*local files only"):
        load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="the folder has no tokenizer.json"):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / "bad.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    with pytest.raises(ConfigError, match="bad.json: not a tokenizers JSON file"):
        load_tokenizer(tmp_path / "bad.json")


def test_tokenize_stores_ids_and_exact_lengths(tok_file: Path) -> None:
    tok = load_tokenizer(tok_file)
    ref = tokenizers.Tokenizer.from_file(str(tok_file))
    samples = [(f"{i:04d}", {"txt": t.encode(), "cls": b"1"}) for i, t in enumerate(TEXTS)]
    out = tokenize_samples(tok, samples, "txt")
    assert out.keep == tuple(range(len(TEXTS))) and out.skipped == ()
    for text, n, fields in zip(TEXTS, out.lengths.tolist(), out.fields):
        want = ref.encode(text).ids
        ids = decode_field(TOKENS_FIELD, fields[TOKENS_FIELD])  # what the loader decodes
        assert ids.dtype == np.uint16 and ids.tolist() == want and n == len(want)
    assert out.lengths.tolist() != [len(t.split()) for t in TEXTS]  # real tokens, not words
    counted = tokenize_samples(tok, samples, "txt", store=False)  # --length txt with a tokenizer
    assert counted.lengths.tolist() == out.lengths.tolist() and counted.fields == tuple({} for _ in TEXTS)
    assert tokenize_samples(tok, [], "txt").lengths.shape == (0,)


def test_field_errors(tok_file: Path) -> None:
    tok = load_tokenizer(tok_file)
    with pytest.raises(ConfigError, match=r"--tokenize jpg: not a text field .*--tokenize txt"):
        tokenize_samples(tok, [("a", {"jpg": b"\xff\xd8"})], "jpg")
    with pytest.raises(ConfigError, match="--length json: not a text field"):
        check_tokenize_field("json", "--length")
    assert check_tokenize_field("Caption.TXT") == "caption.txt"
    samples = [("a", {"txt": b"fine"}), ("b", {"other.txt": b"x"}), ("c", {"txt": b"\xff\xfe bad"})]
    with pytest.raises(SourceError, match=r"shard-000: sample 'b' has no field 'txt' \(fields: other.txt\)"):
        tokenize_samples(tok, samples, "txt", where="shard-000")
    with pytest.raises(BadFileError, match=r"sample 'c' field 'txt' is not UTF-8 text"):
        tokenize_samples(tok, samples[::2], "txt")
    out = tokenize_samples(tok, samples, "txt", on_error="skip", where="shard-000")
    assert out.keep == (0,) and [s["key"] for s in out.skipped] == ["b", "c"]
    assert out.lengths.size == 1 and len(out.fields) == 1


def _in_worker(tok: Tokenizer, text: str) -> list[int]:
    out = tokenize_samples(tok, [("k", {"txt": text.encode()})], "txt")
    return decode_field(TOKENS_FIELD, out.fields[0][TOKENS_FIELD]).tolist()


def test_pickles_by_path_for_pack_workers(tok_file: Path) -> None:
    tok = load_tokenizer(tok_file)
    blob = pickle.dumps(tok)
    assert len(blob) < 2000  # the path and facts, not the tokenizer
    again = pickle.loads(blob)
    assert again == tok and again.encode_batch(["lazy dog"])[0].tolist() == tok.encode_batch(["lazy dog"])[0].tolist()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert pool.submit(_in_worker, tok, TEXTS[0]).result(timeout=120) == _in_worker(tok, TEXTS[0])


def test_missing_tokenizers_names_the_extra(tok_file: Path, tmp_path: Path, monkeypatch) -> None:
    import sys

    from fastfeed.errors import MissingDependencyError

    copy = tmp_path / "copy.json"
    copy.write_bytes(tok_file.read_bytes() + b"\n")  # a new sha256: not in the per-process cache
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'fastfeed\[text\]'"):
        load_tokenizer(copy)


def test_parquet_to_packed_sequences_end_to_end(tok_file: Path, tmp_path: Path) -> None:
    """The path pack + loader will take: parquet rows -> tokens per unit -> lengths -> packed batches."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from fastfeed.loading.order.seqpack import assemble, plan_seqpack
    from fastfeed.packing.sources.table import iter_unit, scan_table

    pq.write_table(pa.table({"text": TEXTS}), tmp_path / "corpus.parquet", row_group_size=6)
    src = scan_table(tmp_path / "corpus.parquet", columns="text=txt")
    tok = load_tokenizer(tok_file)
    tokens: dict[int, np.ndarray] = {}
    lengths: list[int] = []
    for unit in src.units:  # one pack task per unit: one encode_batch call
        samples = list(iter_unit(src, unit))
        out = tokenize_samples(tok, samples, "txt")
        for s, n, f in zip(samples, out.lengths.tolist(), out.fields):
            tokens[int(s.key)] = decode_field(TOKENS_FIELD, f[TOKENS_FIELD])
            lengths.append(n)
    stream = np.concatenate([tokens[i] for i in range(len(TEXTS))]).astype(np.int64)
    assert stream.size == sum(lengths)
    world, got = 2, []
    plans = [plan_seqpack(np.arange(len(TEXTS)), lengths, batch_size=2, seq_len=16, world_size=world, rank=r,
                          drop_last=False) for r in range(world)]
    for step in range(plans[0].num_batches):
        for p in plans:
            b = assemble(p.batch(step), tokens, pad_id=tok.pad_id or 0)
            got.append(b["input_ids"][b["valid"]])
    np.testing.assert_array_equal(np.concatenate(got), stream)


def test_worker_refuses_a_tokenizer_changed_since_scan(tmp_path: Path) -> None:
    path = _train(tmp_path / "t")
    tok = load_tokenizer(path)
    path.write_bytes(path.read_bytes() + b"\n")  # rewritten between planning and the shard writes
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with pytest.raises(ConfigError, match="the file changed since pack started"):
            pool.submit(_in_worker, tok, TEXTS[0]).result(timeout=120)
