"""A real tokenizer at pack time: ``--tokenizer PATH --tokenize FIELD`` and exact ``--length``.

:func:`load_tokenizer` reads a local `tokenizers <https://github.com/huggingface/tokenizers>`_
JSON file (or a folder holding ``tokenizer.json``, as ``save_pretrained`` writes it) into a
:class:`Tokenizer`: its path, sha256, vocabulary size, pad id and the dtype of stored
ids (``uint16`` when the vocabulary fits, else ``uint32``). Nothing is downloaded.

:func:`tokenize_samples` is what a pack worker calls once per shard: it decodes FIELD of
every sample as UTF-8, encodes all texts with one ``encode_batch`` call (the Rust
tokenizer uses its own threads), and returns per sample the token count (for
``lengths.npy``) and, with ``store=True``, the ids as ``.npy`` bytes for the field
:data:`TOKENS_FIELD` (``tokens.npy``). ``--length FIELD`` with a tokenizer is
``store=False``: exact counts, nothing stored. The counts are the lengths of exactly the
ids stored (special tokens of the tokenizer's post-processor included), so a sequence
packer can trust ``lengths.npy``.

Example:
    >>> tok = load_tokenizer("tokenizer.json")                       # doctest: +SKIP
    >>> tok.dtype, tok.pad_id                                         # doctest: +SKIP
    ('uint16', 0)
    >>> out = tokenize_samples(tok, [("a", {"txt": b"hello world"})], "txt")   # doctest: +SKIP
    >>> out.lengths.tolist(), sorted(out.fields[0])                   # doctest: +SKIP
    ([2], ['tokens.npy'])
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fastfeed._util import check_on_error
from fastfeed.errors import BadFileError, ConfigError, SourceError, missing_dependency
from fastfeed.packing.sources.columns import TEXT_EXTS
from fastfeed.packing.sources.base import show

__all__ = [
    "TOKENS_FIELD",
    "TokenizeResult",
    "Tokenizer",
    "check_tokenize_field",
    "load_tokenizer",
    "tokenize_samples",
]

#: The field token ids are stored in (a 1-D ``.npy`` array of ``Tokenizer.dtype``).
TOKENS_FIELD = "tokens.npy"
#: Token names taken as the pad token when the tokenizer sets no padding.
_PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>", "<|endoftext|>")
_CONFIGS = ("tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer, as pack records it (picklable: workers reload it by path).

    Attributes:
        path: the ``tokenizer.json`` file.
        sha256: of that file (goes into the pack fingerprint, so a new tokenizer re-packs).
        vocab_size: with added tokens.
        pad_id: the pad token's id, or None when the tokenizer has none.
        dtype: ``"uint16"`` or ``"uint32"``, the dtype of stored ids.
    """

    path: str
    sha256: str
    vocab_size: int
    pad_id: int | None
    dtype: str
    add_special_tokens: bool = True
    _impl: Any = field(default=None, compare=False, repr=False)

    def _tok(self) -> Any:
        return self._impl if self._impl is not None else _load(self.path, self.sha256)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_impl"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text (arrays of :attr:`dtype`), in one ``encode_batch`` call."""
        if not texts:
            return []
        encs = self._tok().encode_batch(list(texts), add_special_tokens=self.add_special_tokens)
        return [np.asarray(e.ids, dtype=self.dtype) for e in encs]

    def count_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Exact token counts of each text (int64), as :meth:`encode_batch` would store them."""
        if not texts:
            return np.zeros(0, np.int64)
        encs = self._tok().encode_batch(list(texts), add_special_tokens=self.add_special_tokens)
        return np.fromiter((len(e.ids) for e in encs), np.int64, len(encs))

    def index_meta(self) -> dict[str, Any]:
        """What the index should record: ``{"sha256", "vocab_size", "pad_id", "dtype"}``."""
        return {"sha256": self.sha256, "vocab_size": self.vocab_size, "pad_id": self.pad_id,
                "dtype": self.dtype}


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise missing_dependency("tokenizers", "text", "pack --tokenizer and --tokenize") from None
    return tokenizers


@lru_cache(maxsize=4)
def _load(path: str, sha256: str) -> Any:
    """The ``tokenizers.Tokenizer`` of ``path``, whose content must still have ``sha256``
    (cached per process: a pack worker loads it once)."""
    lib = _tokenizers()
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ConfigError(f"--tokenizer {show(path)}: the file changed since pack started (sha256 differs); "
                          "re-run pack so every shard uses one tokenizer")
    try:
        return lib.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # noqa: BLE001  (the Rust side raises plain Exception for any bad JSON)
        raise ConfigError(f"--tokenizer {show(path)}: not a tokenizers JSON file ({str(e)[:200]}); "
                          "pass the tokenizer.json that tokenizer.save() or save_pretrained() wrote") from None


def _resolve(path: str | os.PathLike[str]) -> tuple[Path, Path | None]:
    p = Path(path)
    if p.is_dir():
        if not (p / "tokenizer.json").is_file():
            raise ConfigError(f"--tokenizer {show(str(p))}: the folder has no tokenizer.json; pass the "
                              "tokenizer.json file or the folder save_pretrained() wrote")
        return p / "tokenizer.json", p
    if not p.is_file():
        raise ConfigError(f"--tokenizer {show(str(p))}: no such file (local files only: download the "
                          "tokenizer first, e.g. with huggingface-cli download)")
    return p, None


def _configured_pad(folder: Path | None) -> str | None:
    """The pad token named by ``tokenizer_config.json`` / ``special_tokens_map.json``."""
    for name in _CONFIGS if folder is not None else ():
        try:
            conf = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        pad = conf.get("pad_token") if isinstance(conf, dict) else None
        if isinstance(pad, dict):
            pad = pad.get("content")
        if isinstance(pad, str) and pad:
            return pad
    return None


def _pad_id(tok: Any, folder: Path | None) -> int | None:
    if tok.padding is not None and tok.padding.get("pad_id") is not None:
        return int(tok.padding["pad_id"])
    named = _configured_pad(folder)
    for name in ((named,) if named else _PAD_NAMES):
        tid = tok.token_to_id(name)
        if tid is not None:
            return int(tid)
    return None


def load_tokenizer(path: str | os.PathLike[str], *, add_special_tokens: bool = True) -> Tokenizer:
    """Load ``--tokenizer PATH`` (a ``tokenizer.json`` or a folder holding one); local only.

    The pad id is the tokenizer's padding setting, else the ``pad_token`` of the folder's
    ``tokenizer_config.json``/``special_tokens_map.json``, else a token named
    ``<pad>``/``[PAD]``/``<|pad|>``/``<|padding|>``/``<|endoftext|>``, else None.

    Raises:
        ConfigError: no such file, no ``tokenizer.json`` in the folder, or the file does not load.
        MissingDependencyError: ``tokenizers`` is not installed.
    """
    file, folder = _resolve(path)
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    tok = _load(str(file), digest)
    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    dtype = "uint16" if vocab <= np.iinfo(np.uint16).max + 1 else "uint32"
    return Tokenizer(str(file), digest, vocab, _pad_id(tok, folder), dtype, add_special_tokens, tok)


def check_tokenize_field(field_name: str, what: str = "--tokenize") -> str:
    """Refuse a non-text field for ``--tokenize``/``--length`` with a tokenizer (checked once).

    Example:
        >>> check_tokenize_field("caption.txt")
        'caption.txt'
    """
    if field_name.lower().rpartition(".")[2] not in TEXT_EXTS:
        raise ConfigError(f"{what} {field_name}: not a text field (a text field ends in "
                          f"{', '.join(sorted(TEXT_EXTS))}); name the field that holds the text, e.g. "
                          f"{what} txt")
    return field_name.lower()


@dataclass(frozen=True)
class TokenizeResult:
    """Per sample (in input order, skipped ones left out): token counts and the field to add.

    Attributes:
        keep: indices (into the input) of the samples that were tokenized.
        lengths: int64 token counts, one per kept sample.
        fields: per kept sample ``{"tokens.npy": bytes}`` (empty dicts with ``store=False``).
        skipped: ``{"path", "key", "reason"}`` per sample left out under ``on_error="skip"``.
    """

    keep: tuple[int, ...]
    lengths: np.ndarray
    fields: tuple[dict[str, bytes], ...]
    skipped: tuple[dict[str, str], ...] = ()


def _npy(ids: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, ids, allow_pickle=False)
    return buf.getvalue()


def tokenize_samples(tok: Tokenizer, samples: Sequence[Sequence[Any]], field_name: str,
                     *, store: bool = True, on_error: str = "raise", where: str = "") -> TokenizeResult:
    """Tokenize FIELD of a shard's samples in one batch.

    Args:
        tok: from :func:`load_tokenizer`.
        samples: ``(key, {field: bytes}, ...)`` tuples, e.g. :class:`~fastfeed.packing.sources.rows.Sample` s.
        field_name: the text field (``--tokenize``/``--length``), checked by :func:`check_tokenize_field`.
        store: also return the ids as :data:`TOKENS_FIELD` bytes (``--tokenize``); False for
            ``--length`` only.
        on_error: a sample without the field, or whose bytes are not UTF-8: ``"raise"`` a
            :class:`~fastfeed.errors.SourceError` naming the key, or ``"skip"`` it (recorded).
        where: the source (file, shard) named in messages.

    Example:
        >>> tok = load_tokenizer("tokenizer.json")                        # doctest: +SKIP
        >>> tokenize_samples(tok, [("k", {"txt": b"hi"})], "txt").lengths  # doctest: +SKIP
        array([1])
    """
    field_name = check_tokenize_field(field_name)
    on_error = check_on_error(on_error)
    keep: list[int] = []
    texts: list[str] = []
    skipped: list[dict[str, str]] = []
    prefix = f"{where}: " if where else ""
    for i, sample in enumerate(samples):
        key, fields = sample[0], sample[1]
        data = fields.get(field_name)
        text, reason = None, ""
        if data is None:
            reason = f"has no field {field_name!r} (fields: {', '.join(sorted(fields)) or 'none'})"
        else:
            try:
                text = bytes(data).decode("utf-8")
            except UnicodeDecodeError as e:
                reason = f"field {field_name!r} is not UTF-8 text ({e})"
        if text is not None:
            texts.append(text)
            keep.append(i)
            continue
        if on_error == "raise":
            cls = SourceError if data is None else BadFileError
            raise cls(f"{prefix}sample {show(key)!r} {reason}; fix the sample or choose another field, "
                      "or pass --on-error skip")
        skipped.append({"path": where, "key": show(key), "reason": reason})
    if store:
        ids = tok.encode_batch(texts)
        lengths = np.fromiter((len(a) for a in ids), np.int64, len(ids))
        out = tuple({TOKENS_FIELD: _npy(a)} for a in ids)
    else:
        lengths = tok.count_batch(texts)
        out = tuple({} for _ in texts)
    return TokenizeResult(tuple(keep), lengths, out, tuple(skipped))
