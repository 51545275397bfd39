"""Turning lists of samples into one batch dict, without per-sample tensors.

:func:`collate` is the general rule (used for raw bytes and after a user ``transform``):

- ``"__key__"``: the list of sample keys, always;
- numpy arrays: stacked into one tensor; an ``"image"`` given as HWC uint8 arrays
  becomes a uint8 ``N x C x H x W`` tensor (a zero-copy view of the NHWC stack, i.e.
  ``torch.channels_last`` memory format);
- tensors: ``torch.stack``;
- ints (and bools) / floats: one int64 (bool) / float64 tensor;
- anything else (bytes, str, dicts, None for a missing field): a list.

With a :class:`Padding` (``loader()`` passes one for token data; see
:func:`pad_fields`), arrays that differ only along their first axis are padded
instead of refused:

- ``"input_ids"`` is always padded (even when every sample has the same length), with
  ``pad_id``, to the longest sample rounded up to a multiple of ``pad_multiple``, and
  ``"attention_mask"`` (int64, 1 on real tokens, 0 on padding) is added unless the
  samples bring their own;
- any other array field whose lengths equal ``input_ids``' sample by sample
  (``attention_mask``, ``token_type_ids``, ``labels`` of a tokenizer) is padded with 0
  to the same width, so the fields line up;
- any other ragged array field is padded with 0 to its own longest (same rounding);
- with ``max_length``, longer samples are truncated to it first and no batch is wider.

:func:`pad_ragged` is that rule for one field (:class:`~fastfeed.decode.padding.PadCollate`,
the ``collate_fn`` for a DataLoader of your own, runs it too).

:func:`batch_buffer` allocates the uint8 batch array the decoders fill in place; inside
a DataLoader worker it lives in shared memory, so handing the batch to the main process
copies nothing.

Example:
    >>> b = collate([{"__key__": "a", "cls": 1, "txt": "x"}, {"__key__": "b", "cls": 2, "txt": "y"}])
    >>> b["__key__"], b["cls"].tolist(), b["txt"]
    (['a', 'b'], [1, 2], ['x', 'y'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from fastfeed.decode import bufpool
from fastfeed.errors import ConfigError

__all__ = ["INPUT_IDS", "MASK", "Padding", "batch_buffer", "collate", "mask_of", "nhwc_to_nchw", "pad_fields",
           "pad_ragged"]

#: The padded token field and its mask (the names Hugging Face models take).
INPUT_IDS = "input_ids"
MASK = "attention_mask"


@dataclass(frozen=True)
class Padding:
    """How :func:`collate` pads ragged arrays (see the module docstring).

    Attributes:
        pad_id: the value of padded ``input_ids`` positions.
        pad_multiple: round padded lengths up to a multiple of this (8 suits tensor cores).
        max_length: truncate longer samples to this many positions (None: no truncation).
    """

    pad_id: int | float = 0
    pad_multiple: int = 1
    max_length: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.pad_multiple, bool) or not isinstance(self.pad_multiple, int) or self.pad_multiple < 1:
            raise ConfigError(f"pad_multiple={self.pad_multiple!r} must be an integer >= 1")
        if self.max_length is not None and (isinstance(self.max_length, bool) or not isinstance(self.max_length, int)
                                            or self.max_length < 1):
            raise ConfigError(f"max_length={self.max_length!r} must be an integer >= 1, or None")

    def width(self, longest: int) -> int:
        """The padded length of a batch whose longest sample has ``longest`` positions.

        Example:
            >>> Padding(pad_multiple=8).width(9), Padding(pad_multiple=4, max_length=6).width(9)
            (16, 6)
        """
        longest = longest if self.max_length is None else min(longest, self.max_length)
        width = -(-longest // self.pad_multiple) * self.pad_multiple
        return width if self.max_length is None else min(width, self.max_length)


def batch_buffer(shape: Sequence[int]) -> tuple[torch.Tensor, np.ndarray]:
    """An uninitialised uint8 tensor of ``shape`` and a numpy view of the same memory.

    Inside a DataLoader worker the storage is shared memory (as ``default_collate``
    does), so sending it to the main process costs no copy; with a loader's
    :class:`~fastfeed.decode.bufpool.BufferPool` it is a buffer the main process has let go of.
    """
    shape = tuple(int(s) for s in shape)
    t: torch.Tensor | None = None
    pooled = bufpool.active()
    if pooled is not None and torch.utils.data.get_worker_info() is not None:
        storage = pooled[0].take(pooled[1], math.prod(shape))
        t = torch.empty(0, dtype=torch.uint8).set_(storage)[: math.prod(shape)].view(shape)
    elif torch.utils.data.get_worker_info() is not None:
        try:
            storage = torch.empty(0, dtype=torch.uint8)._typed_storage()._new_shared(
                max(1, math.prod(shape))
            )
            t = torch.empty(0, dtype=torch.uint8).new(storage)[: math.prod(shape)].view(shape)
        except (AttributeError, RuntimeError, TypeError):  # private API moved: plain memory
            t = None
    if t is None:
        t = torch.empty(shape, dtype=torch.uint8)
    return t, t.numpy()


#: Tensors larger than this keep a storage of their own in :func:`one_storage`.
ONE_STORAGE_MAX_BYTES = 4 << 20
_ONE_STORAGE_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                 torch.float16, torch.bfloat16, torch.float32, torch.float64})


def one_storage(batch: dict[str, Any]) -> dict[str, Any]:
    """In a DataLoader worker: the batch with its tensors moved into ONE shared-memory storage.

    A worker sends every storage of a batch to the main process with a file descriptor of
    its own: a socket connection and an authentication handshake in both processes (torch's
    default ``file_descriptor`` sharing), ~0.4 ms of CPU a storage on the 2-core machine of
    ``benchmarks/RESULTS.md`` (a token batch of 4 tensors spent more on that than on reading
    and building it). One storage makes it one handshake. It is not an extra copy: a tensor
    that is not in shared memory is copied into shared memory to be sent anyway.

    Each tensor becomes a contiguous view, of its own shape and dtype (64-byte aligned), of the
    storage: the same values, shapes, dtypes and contiguity, only ``storage_offset()`` and the
    storage's size differ (a tensor kept alone keeps the batch's small tensors alive: only
    tensors of at most :data:`ONE_STORAGE_MAX_BYTES` are joined, so a label kept for a metric
    never holds an image batch in memory; those large tensors cost one handshake each). Tensors
    already in shared memory (image batch buffers), views that do not cover their storage,
    tensors that share a storage, need grad or are not on the CPU stay as they are, as do
    values that are not tensors. Outside a worker (``num_workers=0``: nothing is sent) the
    batch is returned unchanged.

    Example:
        >>> b = one_storage({"a": torch.arange(3), "k": ["x"]})  # in this process: unchanged
        >>> b["a"].tolist(), b["k"]
        ([0, 1, 2], ['x'])
    """
    if torch.utils.data.get_worker_info() is None:
        return batch
    at, spans, seen = 0, {}, set()
    for k, t in batch.items():
        if (type(t) is torch.Tensor and t.device.type == "cpu" and t.dtype in _ONE_STORAGE_DTYPES
                and not t.requires_grad and t.is_contiguous() and t.storage_offset() == 0
                and t.nbytes <= ONE_STORAGE_MAX_BYTES
                and t.untyped_storage().nbytes() == t.nbytes and not t.is_shared()):
            ptr = t.untyped_storage().data_ptr()
            if ptr in seen:
                continue
            seen.add(ptr)
            spans[k] = at
            at += -(-t.nbytes // 64) * 64
    if len(spans) < 2:
        return batch  # one storage already
    try:
        flat = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(at))
    except (AttributeError, RuntimeError, TypeError):  # private API moved: torch shares each one
        return batch
    out = dict(batch)
    for k, start in spans.items():
        t = batch[k]
        view = flat[start:start + t.nbytes].view(t.dtype).view(t.shape)
        view.copy_(t)
        out[k] = view
    return out


def nhwc_to_nchw(t: torch.Tensor) -> torch.Tensor:
    """View an NHWC tensor as NCHW (channels_last memory format), without copying."""
    return t.permute(0, 3, 1, 2)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _stack_arrays(key: str, vals: list[np.ndarray]) -> torch.Tensor:
    shapes = {v.shape for v in vals}
    if len(shapes) > 1:
        raise ConfigError(
            f"field {key!r}: samples of one batch have different shapes {sorted(shapes)[:4]}; "
            "pass image_size= (images), make your transform return equal shapes, or return "
            "1-D token arrays as 'input_ids' (loader() pads ragged arrays of token data)"
        )
    first = vals[0]
    if key == "image" and first.ndim == 3 and first.dtype == np.uint8 and first.shape[-1] in (1, 3, 4):
        buf, arr = batch_buffer((len(vals), *first.shape))
        for j, v in enumerate(vals):
            arr[j] = v
        return nhwc_to_nchw(buf)
    return torch.from_numpy(np.stack(vals))


def _collate_values(key: str, vals: list[Any]) -> Any:
    if not vals:
        return vals
    if all(isinstance(v, np.ndarray) for v in vals):
        return _stack_arrays(key, vals)
    if all(isinstance(v, torch.Tensor) for v in vals):
        shapes = {tuple(v.shape) for v in vals}
        if len(shapes) > 1:
            raise ConfigError(
                f"field {key!r}: tensors of one batch have different shapes {sorted(shapes)[:4]}; "
                "make your transform return equal shapes"
            )
        return torch.stack(vals)
    if all(_is_int(v) for v in vals):
        return torch.tensor(vals, dtype=torch.int64)
    if all(isinstance(v, (bool, np.bool_)) for v in vals):
        return torch.tensor(vals, dtype=torch.bool)
    if all(isinstance(v, (float, np.floating)) for v in vals):
        return torch.tensor(vals, dtype=torch.float64)
    return list(vals)


def pad_ragged(vals: Sequence[np.ndarray], pad: Padding, value: float,
               width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Arrays ragged along their first axis as one padded array, and each one's length.

    Each array is truncated to ``pad.max_length``, then padded with ``value`` to ``width``
    (None: ``pad.width`` of the longest). Integer arrays give int64, others their common dtype.

    Example:
        >>> out, lengths = pad_ragged([np.array([1, 2, 3]), np.array([4])], Padding(pad_multiple=2), 9)
        >>> out.tolist(), lengths.tolist()
        ([[1, 2, 3, 9], [4, 9, 9, 9]], [3, 1])
    """
    if pad.max_length is not None:
        vals = [v[: pad.max_length] for v in vals]
    lengths = np.fromiter((v.shape[0] for v in vals), np.int64, len(vals))
    width = pad.width(int(lengths.max())) if width is None else width
    dtype = np.int64 if all(v.dtype.kind in "biu" for v in vals) else np.result_type(*vals)
    out = np.full((len(vals), width, *vals[0].shape[1:]), value, dtype=dtype)
    for j, v in enumerate(vals):
        out[j, : v.shape[0]] = v
    return out, lengths


def mask_of(lengths: np.ndarray, width: int) -> np.ndarray:
    """The int64 ``(B, width)`` mask of samples of ``lengths``: 1 on real positions, 0 on padding.

    Example:
        >>> mask_of(np.array([2, 1]), 3).tolist()
        [[1, 1, 0], [1, 0, 0]]
    """
    return (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)


def _raggable(vals: list[Any]) -> bool:
    """Arrays of at least one axis that agree beyond the first axis."""
    return (all(isinstance(v, np.ndarray) and v.ndim >= 1 for v in vals)
            and len({v.shape[1:] for v in vals}) == 1)


def pad_fields(samples: Sequence[dict[str, Any]], pad: Padding) -> dict[str, torch.Tensor]:
    """The padded fields of ``samples`` (the rules of the module docstring), as tensors.

    Example:
        >>> out = pad_fields([{"input_ids": np.array([4, 5, 6])}, {"input_ids": np.array([7])}],
        ...                  Padding(pad_id=1, pad_multiple=4))
        >>> out["input_ids"].tolist(), out["attention_mask"].tolist()
        ([[4, 5, 6, 1], [7, 1, 1, 1]], [[1, 1, 1, 0], [1, 0, 0, 0]])
    """
    out: dict[str, torch.Tensor] = {}
    names: dict[str, None] = {}
    for s in samples:
        names.update(dict.fromkeys(k for k in s if not k.startswith("__")))
    ids = [s.get(INPUT_IDS) for s in samples]
    lengths: list[int] | None = None
    if _raggable(ids):
        lengths = [v.shape[0] for v in ids]
        padded, kept = pad_ragged(ids, pad, pad.pad_id)
        out[INPUT_IDS] = torch.from_numpy(padded)
        if MASK not in names:
            out[MASK] = torch.from_numpy(mask_of(kept, padded.shape[1]))
    for k in names:
        vals = [s.get(k) for s in samples]
        if k in (INPUT_IDS, "image") or not _raggable(vals):  # images of other sizes stay an error
            continue
        own = [v.shape[0] for v in vals]
        if lengths is not None and own == lengths:
            out[k] = torch.from_numpy(pad_ragged(vals, pad, 0, width=out[INPUT_IDS].shape[1])[0])
        elif len(set(own)) > 1:
            out[k] = torch.from_numpy(pad_ragged(vals, pad, 0)[0])
    return out


def collate(samples: Sequence[dict[str, Any]], pad: Padding | None = None) -> dict[str, Any]:
    """Collate sample dicts by the rules of the module docstring (``pad``: pad ragged arrays).

    Keys missing from some samples give None in lists (a tensor field must be present
    in every sample of the batch).

    Example:
        >>> import numpy as np
        >>> b = collate([{"__key__": "a", "image": np.zeros((4, 5, 3), np.uint8)}] * 2)
        >>> tuple(b["image"].shape)
        (2, 3, 4, 5)
    """
    keys: dict[str, None] = {}
    for s in samples:
        keys.update(dict.fromkeys(s))
    out: dict[str, Any] = {"__key__": [s.get("__key__", "") for s in samples]}
    padded = pad_fields(samples, pad) if pad is not None and samples else {}
    for k in keys:
        if k == "__key__" or k in padded:
            continue
        vals = [s.get(k) for s in samples]
        if any(v is None for v in vals):
            out[k] = vals
        else:
            out[k] = _collate_values(k, vals)
    out.update(padded)
    return out
