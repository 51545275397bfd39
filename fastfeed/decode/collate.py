"""Turning lists of samples into one batch dict, without per-sample tensors.

:func:`collate` is the general rule (used for raw bytes and after a user ``transform``):

- ``"__key__"``: the list of sample keys, always;
- numpy arrays: stacked into one tensor; an ``"image"`` given as HWC uint8 arrays
  becomes a uint8 ``N x C x H x W`` tensor (a zero-copy view of the NHWC stack, i.e.
  ``torch.channels_last`` memory format);
- tensors: ``torch.stack``;
- ints (and bools) / floats: one int64 (bool) / float64 tensor;
- anything else (bytes, str, dicts, None for a missing field): a list.

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
from typing import Any, Sequence

import numpy as np
import torch

from fastfeed.decode import bufpool
from fastfeed.errors import ConfigError

__all__ = ["batch_buffer", "collate", "nhwc_to_nchw"]


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
            "pass image_size= (images) or make your transform return equal shapes"
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


def collate(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Collate sample dicts by the rules of the module docstring.

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
    for k in keys:
        if k == "__key__":
            continue
        vals = [s.get(k) for s in samples]
        if any(v is None for v in vals):
            out[k] = vals
        else:
            out[k] = _collate_values(k, vals)
    return out
