"""Decode non-image sample fields by extension, compatibly with webdataset.

The loader calls :func:`decode_field` for every field of a sample that is not an
image (``is_image(ext)`` tells which are); images are left to ``decode/cpu.py`` or
DALI. The rule is webdataset's: the *last* dot-separated part of the field name picks
the decoder, after a trailing ``.gz`` has been decompressed (so ``txt.gz`` gives text
and ``seg.npy`` gives an array). Field names are lower-case already (the tar readers
lower-case them, as webdataset does).

=======================================  =============================================
last part of the extension               value
=======================================  =============================================
``gz``                                   gunzipped, then decoded by the part before it
                                         (``txt.gz`` -> str, ``json.gz`` -> dict,
                                         ``jpg.gz`` -> jpeg bytes, ``gz`` -> bytes)
``txt`` ``text`` ``transcript``          ``str`` (UTF-8)
``cls`` ``cls2`` ``index`` ``inx``       ``int`` (ASCII digits, surrounding whitespace
``id`` ``class`` ``count``               allowed)
``json`` ``jsn``                         ``json.loads`` result (dict, list, ...)
``npy``                                  ``numpy.ndarray`` (``allow_pickle=False``)
``npz``                                  ``dict`` of arrays (``allow_pickle=False``)
``ten`` ``tb``                           ``list`` of ``numpy.ndarray`` (webdataset's
                                         "tenbin" tensor format)
``mp`` ``msg`` ``msgpack``               msgpack object (needs ``msgpack``)
``pyd`` ``pickle`` ``pkl`` ``pth``       raw ``bytes``: never unpickled (see below)
image extensions (:data:`IMAGE_EXTENSIONS`)  raw ``bytes`` (decoded by the image decoder)
anything else (``cbor``, audio, ...)     raw ``bytes``
=======================================  =============================================

Pickle (and ``torch.save`` files, which are pickles) can run arbitrary code when
loaded, and a shard is data from wherever it was downloaded, so fastfeed never
unpickles: those fields arrive as bytes. If you trust the shards, unpickle them
yourself in a ``transform`` (with the ``pickle`` module, or
``torch.load(io.BytesIO(sample["pth"]), weights_only=True)``).

A field that does not decode raises :class:`~fastfeed.errors.SampleError` whose
message names the field and what was wrong; callers that know the shard, key and
offset re-raise with them (``on_error="raise"``) or count a skip (``"skip"``).

Example:
    >>> import gzip
    >>> decode_field("txt.gz", gzip.compress(b"hello\\n"))
    'hello\\n'
    >>> decode_field("cls", b" 7\\n"), decode_field("json", b'{"a": 1}')
    (7, {'a': 1})
    >>> decode_field("jpg", b"\\xff\\xd8raw")
    b'\\xff\\xd8raw'
    >>> decode_field("pyd", b"\\x80\\x04K\\x01.")      # never unpickled
    b'\\x80\\x04K\\x01.'
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import struct
import zlib
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from fastfeed.errors import SampleError, missing_dependency
from fastfeed.formats.naming import IMAGE_EXTENSIONS, is_image, last_ext

__all__ = [
    "IMAGE_EXTENSIONS",
    "PICKLE_EXTENSIONS",
    "decode_field",
    "decode_fields",
    "decode_tenbin",
    "is_image",
    "last_ext",
]

#: Extensions that hold pickles: returned as raw bytes, never unpickled.
PICKLE_EXTENSIONS: frozenset[str] = frozenset({"pyd", "pickle", "pkl", "pth"})

#: Refuse to gunzip a field past this many bytes: a guard against gzip bombs in
#: untrusted shards (a real field this large belongs in its own shard).
MAX_GUNZIP_BYTES = 1 << 31


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _int(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def _json(data: bytes) -> Any:
    return json.loads(data)


# The header numpy writes for a plain array (``np.save``): parsed with one regex instead of
# ``np.load``'s literal evaluation, which costs ~28 us per call (a third of the loader's CPU
# on short token arrays). Anything else (structured dtypes, other spellings) goes to np.load.
_NPY_HEADER = re.compile(
    rb"\{'descr': '([<>|=]?[biuf]\d{1,2})', 'fortran_order': (False|True), 'shape': \(((?:\d+, ?)*\d*)\), \} *\n?")


_NPY_DTYPES: dict[bytes, np.dtype] = {}  # descr -> dtype: a few distinct ones, parsed once


def _npy(data: bytes) -> np.ndarray:
    """A ``.npy`` member as a (writable) array; never unpickles (``allow_pickle=False``).

    Example:
        >>> buf = io.BytesIO(); np.save(buf, np.arange(6, dtype=np.uint16).reshape(2, 3))
        >>> _npy(buf.getvalue()).tolist()
        [[0, 1, 2], [3, 4, 5]]
    """
    view = memoryview(data)
    if len(view) >= 10 and view[:6] == b"\x93NUMPY" and view[6] in (1, 2, 3):
        size, start = (view[8] | view[9] << 8, 10) if view[6] == 1 else \
            (int.from_bytes(view[8:12], "little"), 12)
        m = _NPY_HEADER.fullmatch(view[start:start + size].tobytes())
        if m is not None:
            descr = m.group(1)
            dtype = _NPY_DTYPES.get(descr)
            if dtype is None:
                dtype = _NPY_DTYPES.setdefault(descr, np.dtype(descr.decode()))
            dims = m.group(3)
            shape = tuple(int(d) for d in dims.split(b",") if d.strip())
            count = math.prod(shape)
            if count * dtype.itemsize == len(view) - start - size:
                flat = np.frombuffer(view, dtype=dtype, count=count, offset=start + size).copy()
                if len(shape) == 1:
                    return flat
                return flat.reshape(shape, order="F" if m.group(2) == b"True" else "C")
    return np.load(io.BytesIO(data), allow_pickle=False)


def _npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def _msgpack(data: bytes) -> Any:
    try:
        import msgpack
    except ImportError:
        raise missing_dependency("msgpack", "wds", "msgpack fields (.mp/.msg/.msgpack)") from None
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _raw(data: bytes) -> bytes:
    return data


_DECODERS: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(("txt", "text", "transcript"), _text),
    **dict.fromkeys(("cls", "cls2", "index", "inx", "id", "class", "count"), _int),
    **dict.fromkeys(("json", "jsn"), _json),
    "npy": _npy,
    "npz": _npz,
    **dict.fromkeys(("ten", "tb"), lambda data: decode_tenbin(data)),
    **dict.fromkeys(("mp", "msg", "msgpack"), _msgpack),
    **dict.fromkeys(PICKLE_EXTENSIONS, _raw),
}


def _gunzip(data: bytes) -> bytes:
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip container
    out = d.decompress(data, MAX_GUNZIP_BYTES)
    if d.unconsumed_tail:
        raise ValueError(f"decompresses to more than {MAX_GUNZIP_BYTES} bytes")
    if not d.eof:
        raise ValueError("truncated gzip data")
    if d.unused_data:  # concatenated gzip members are valid gzip: let gzip handle them
        return gzip.decompress(data)
    return out


def decode_field(ext: str, data: bytes) -> Any:
    """Decode one field's bytes by its extension (see the module table).

    Args:
        ext: the field name, as in the sample dict (``"txt.gz"``, ``"cls"``, ``"seg.npy"``).
        data: the field's bytes.

    Returns:
        The decoded value; images, pickles and unknown extensions as the same bytes.

    Raises:
        SampleError: the bytes are not valid for the extension (message names the field).
        MissingDependencyError: ``msgpack`` is needed and not installed.

    Example:
        >>> decode_field("seg.cls2", b"12")
        12
    """
    decoder = _BY_FIELD.get(ext, _UNSEEN)
    if decoder is not _UNSEEN:  # a field name seen before, not gzipped: its decoder at once
        try:
            return data if decoder is None else decoder(data)
        except _DECODE_ERRORS as e:
            raise _field_error(ext, ext.lower(), e) from None
    name = ext.lower()
    if last_ext(name) != "gz" and len(_BY_FIELD) < 4096:
        _BY_FIELD[ext] = _DECODERS.get(last_ext(name))
    try:
        while last_ext(name) == "gz":
            data = _gunzip(data)
            name = name[:-3]  # "txt.gz" -> "txt"; a bare "gz" -> "" (raw bytes)
        decoder = _DECODERS.get(last_ext(name))
        return data if decoder is None else decoder(data)
    except _DECODE_ERRORS as e:
        raise _field_error(ext, name, e) from None


# msgpack's errors (ExtraData, FormatError, ...) are ValueErrors too
_DECODE_ERRORS = (ValueError, UnicodeDecodeError, EOFError, OSError, zlib.error, struct.error)
_UNSEEN = object()
#: field name -> its decoder (None: raw bytes), for names that are not gzipped; filled as
#: fields are seen (a dataset has a few), so a sample's fields skip the extension rule.
_BY_FIELD: dict[str, Callable[[bytes], Any] | None] = {}


def _field_error(ext: str, name: str, e: BaseException) -> SampleError:
    return SampleError(
        f"field '{ext}' does not decode as .{last_ext(name) or 'gz'} ({type(e).__name__}: {e}); "
        "fix or drop the field, or pass on_error='skip'"
    )


def decode_fields(
    sample: Mapping[str, Any], *, skip: Iterable[str] = ()
) -> dict[str, Any]:
    """Decode every non-image field of a sample dict (keys starting with ``__`` pass through).

    Args:
        sample: ``{"__key__": ..., "<ext>": bytes, ...}`` as a shard reader returns it.
        skip: field names to leave as they are (e.g. the ones a transform wants raw).

    Example:
        >>> decode_fields({"__key__": "a", "cls": b"3", "jpg": b"..."})
        {'__key__': 'a', 'cls': 3, 'jpg': b'...'}
    """
    keep = set(skip)
    return {
        k: v if k.startswith("__") or k in keep or is_image(k) or not isinstance(v, (bytes, bytearray, memoryview))
        else decode_field(k, bytes(v))
        for k, v in sample.items()
    }


# --------------------------------------------------------------------- tenbin
# webdataset's ".ten" format: a sequence of chunks, each ``b"~TenBin~"``, an int64
# byte length, and the bytes zero-padded to a multiple of 64. Chunks come in pairs:
# a header (int64 words: dtype code as 8 ASCII bytes, an 8-byte info string, ndim,
# the dims) and the array's raw bytes. Written from the format description.
_TEN_MAGIC = b"~TenBin~"
_TEN_DTYPES = {
    "f2": "float16", "f4": "float32", "f8": "float64",
    "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64",
    "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64",
}


def _ten_chunks(buf: bytes) -> list[memoryview]:
    view = memoryview(buf)
    chunks: list[memoryview] = []
    pos = 0
    while pos < len(view):
        if bytes(view[pos:pos + 8]) != _TEN_MAGIC:
            raise ValueError(f"no tenbin magic at byte {pos}")
        (n,) = struct.unpack_from("<q", view, pos + 8)
        start = pos + 16
        if n < 0 or start + n > len(view):
            raise ValueError(f"chunk at byte {pos} claims {n} bytes, only {len(view) - start} left")
        chunks.append(view[start:start + n])
        pos = start + -(-n // 64) * 64
    return chunks


def decode_tenbin(data: bytes) -> list[np.ndarray]:
    """Decode webdataset's ``.ten`` tensor format into a list of (writable) arrays.

    Example:
        >>> import struct
        >>> hdr = b"u1".ljust(8, b"\\0") + b"".ljust(8, b"\\0") + struct.pack("<qq", 1, 3)
        >>> chunk = lambda b: b"~TenBin~" + struct.pack("<q", len(b)) + b.ljust(64, b"\\0")
        >>> decode_tenbin(chunk(hdr) + chunk(bytes([1, 2, 3])))[0].tolist()
        [1, 2, 3]
    """
    chunks = _ten_chunks(bytes(data))
    if len(chunks) % 2:
        raise ValueError(f"{len(chunks)} chunks; tenbin arrays come as header + data pairs")
    arrays: list[np.ndarray] = []
    for header, body in zip(chunks[0::2], chunks[1::2]):
        if len(header) < 24 or len(header) % 8:
            raise ValueError(f"array header of {len(header)} bytes is malformed")
        code = bytes(header[:8]).rstrip(b"\0").decode("ascii", "replace")
        if code not in _TEN_DTYPES:
            raise ValueError(f"unknown tenbin dtype code {code!r}")
        words = np.frombuffer(header, dtype="<i8")
        ndim = int(words[2])
        if not 0 <= ndim <= len(words) - 3:
            raise ValueError(f"array header claims {ndim} dimensions")
        shape = tuple(int(d) for d in words[3:3 + ndim])
        dtype = np.dtype(_TEN_DTYPES[code])
        count = int(np.prod(shape, dtype=np.int64))
        if count * dtype.itemsize > len(body):
            raise ValueError(f"array of shape {shape} {dtype} needs more than {len(body)} bytes")
        arrays.append(np.frombuffer(bytearray(body[:count * dtype.itemsize]), dtype=dtype).reshape(shape))
    return arrays
