"""Token datasets for the loader tests: a ``tokens.npy`` field (uint16 npy bytes) and ``lengths.npy``.

Written with the same low-level writer as the other loader tests (:func:`write_dataset`),
then the index is saved again with the token counts, as ``pack --tokenize`` records them.
Token ``p`` of document ``i`` is ``i * 100 + p``, so every delivered token names its
document and position.
"""

from __future__ import annotations

import io
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fastfeed.packed.index import DatasetIndex

from _loader_data import write_dataset


def doc_length(i: int) -> int:
    """Lengths 0..97 (document 3 is empty), irregular so rows cut documents everywhere."""
    return 0 if i == 3 else (i * 37 + 11) % 97 + 1


def doc_tokens(i: int) -> np.ndarray:
    return (i * 100 + np.arange(doc_length(i))).astype(np.uint16)


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def token_fields(i: int, rng: np.random.Generator) -> dict[str, bytes]:
    return {"tokens.npy": _npy(doc_tokens(i)), "txt": f"doc {i}".encode()}


def write_token_dataset(root: str | Path, *, shard_counts: Sequence[int] = (40, 40, 40, 30),
                        tokenizer: dict[str, Any] | None = None) -> DatasetIndex:
    """Shards of token documents (``s00000``...) with ``lengths.npy`` (and, when this fastfeed's
    index has the field, the tokenizer metadata pack stores)."""
    index = write_dataset(root, shard_counts=shard_counts, fields=token_fields, labels=False)
    lengths = np.array([doc_length(i) for i in range(index.num_samples)], dtype=np.int64)
    extra: dict[str, Any] = {"lengths_field": "tokens"}
    if tokenizer is not None:
        extra["tokenizer"] = tokenizer
    index = replace(index, **extra).with_arrays(offsets=np.asarray(index.offsets), lengths=lengths)
    index.save(root)
    return DatasetIndex.load(root)


def index_has_tokenizer() -> bool:
    """Whether :class:`DatasetIndex` records pack's tokenizer metadata (``tokenizer``)."""
    return any(f.name == "tokenizer" for f in fields(DatasetIndex))
