"""``.npy`` members: the header fast path gives what ``np.load`` gives, and never unpickles."""

from __future__ import annotations

import io

import numpy as np
import pytest

from fastfeed.decode.fields import decode_field
from fastfeed.errors import SampleError

ARRAYS = [
    np.arange(100, dtype=np.uint16),
    np.zeros((0,), np.int32),
    np.ones((2, 3, 4), np.float32),
    np.asfortranarray(np.arange(12).reshape(3, 4)),
    np.array(5, dtype=np.int64),
    np.array([True, False]),
    np.arange(10, dtype=">i4"),
    np.zeros((3,), dtype=[("a", "<i4"), ("b", "<f8")]),  # structured: np.load's path
    np.arange(70_000, dtype=np.uint32),  # a header numpy pads to a longer block
]


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


@pytest.mark.parametrize("a", ARRAYS, ids=lambda a: f"{a.dtype}-{a.shape}")
def test_npy_member_matches_np_load(a: np.ndarray) -> None:
    data = _npy(a)
    got, ref = decode_field("tokens.npy", data), np.load(io.BytesIO(data), allow_pickle=False)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert np.array_equal(got, ref)
    assert got.flags.writeable and got.flags.c_contiguous == ref.flags.c_contiguous


def test_npy_truncated_or_object_is_an_error_not_a_guess() -> None:
    data = _npy(np.arange(300, dtype=np.uint16))
    with pytest.raises(SampleError, match="tokens.npy|x.npy"):
        decode_field("tokens.npy", data[:-4])
    with pytest.raises(SampleError, match="x.npy"):  # object arrays would need unpickling: refused
        decode_field("x.npy", _npy(np.array([{"a": 1}], dtype=object)))
