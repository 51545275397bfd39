"""Table columns -> sample fields: which field a column becomes and how a value is stored.

Used by :mod:`fastfeed.packing.sources.parquet` for parquet files and HF ``datasets``; knows
pyarrow types but reads no file.

A column's field name follows the rule of JSONL keys (:func:`member_name`, the one rule for both):
a name that is already a WebDataset extension (``jpg``, ``txt``, ``cls``) is kept, otherwise
the extension is appended (``caption`` -> ``caption.txt``). Without a ``columns`` mapping
every column is packed, its extension chosen by its type:

=========================================  ============================================
arrow type                                 field extension and stored bytes
=========================================  ============================================
string                                     ``txt``: UTF-8
binary                                     sniffed per value: ``jpg`` ``png`` ``gif``
                                           ``webp`` ... for images, ``wav`` ``flac``
                                           ``ogg`` ``mp3`` for audio, else ``bin``
struct ``{bytes, path}`` (HF ``Image``,    as binary; when the bytes are not sniffed,
``Audio``)                                 the extension of ``path``
bool, integer, float                       ``json`` (``cls``/``label`` also give the label)
list of numbers (any depth, rectangular)   ``npy`` (its dtype kept)
anything else (lists of strings, structs)  ``json``
=========================================  ============================================

With a mapping (``--columns image=jpg,caption=txt``) only the named columns are packed,
under the field names given (a name without ``=`` keeps the automatic one), and the
field's extension decides the encoding: ``txt`` stores text, ``cls``/``id``/``index``
an integer in ASCII, ``json`` JSON, ``npy`` a numpy array, image extensions need image
bytes, any other extension stores the bytes as they are.

Example:
    >>> parse_columns("image=jpg, caption=txt,id")
    {'image': 'jpg', 'caption': 'txt', 'id': ''}
    >>> encode("txt", "a cat"), encode("cls", 3), encode("json", [1, 2])
    (b'a cat', b'3', b'[1,2]')
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastfeed.errors import ConfigError
from fastfeed.formats.images import sniff
from fastfeed.formats.naming import IMAGE_EXTENSIONS as IMAGE_EXTS
from fastfeed.formats.naming import field_ext

__all__ = [
    "INT_EXTS",
    "LABEL_COLUMNS",
    "TEXT_EXTS",
    "ColumnField",
    "auto_field",
    "encode",
    "media_ext",
    "member_name",
    "parse_columns",
    "resolve_columns",
]

#: Field extensions stored as UTF-8 text.
TEXT_EXTS = frozenset({"txt", "text", "transcript"})
#: Field extensions stored as an integer in ASCII (webdataset's ``cls`` convention).
INT_EXTS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id"})
#: Columns whose integer value is also the sample's label (as for JSONL manifests).
LABEL_COLUMNS = ("cls", "label")
_SNIFFED = {"jpeg": "jpg", "png": "png", "gif": "gif", "bmp": "bmp", "webp": "webp", "tiff": "tif",
            "pnm": "ppm", "isobmff": "avif"}


_KNOWN_FIELDS = IMAGE_EXTS | {
    "txt", "text", "transcript", "cls", "cls2", "class", "count", "index", "inx", "id",
    "json", "jsn", "npy", "npz", "wav", "flac", "mp3", "ogg", "mp4", "ten", "msgpack", "mpk",
    "cbor", "bin", "seg",
}


def member_name(name: str, ext: str) -> str:
    """Member (field) name for a JSON key or column ``name`` holding a value of extension ``ext``
    (``txt`` for strings, ``json`` for other values, a file's extension).

    A name that already contains a dot or is a WebDataset extension is used as is (lower
    case); otherwise the extension is appended.

    Example:
        >>> member_name("image", "jpg"), member_name("jpg", "jpg"), member_name("caption", "txt")
        ('image.jpg', 'jpg', 'caption.txt')
    """
    name = name.lower()
    if "." in name or name in _KNOWN_FIELDS:
        return field_ext(name)
    return f"{name}.{field_ext(ext)}"


@dataclass(frozen=True)
class ColumnField:
    """How one column is packed.

    Attributes:
        column: the column name in the table.
        field: the field (member extension), or ``""`` when it is chosen per value
            (binary columns without a mapping: the sniffed type).
        kind: the column's value kind: ``text``, ``binary``, ``media`` (a ``{bytes, path}``
            struct), ``scalar``, ``array`` (numeric lists) or ``other``.
    """

    column: str
    field: str
    kind: str

    def field_for(self, ext: str) -> str:
        """The field of one value whose sniffed extension is ``ext`` (binary columns)."""
        return self.field or auto_field(self.column, ext)


def _fits(ext: str, auto: str) -> bool:
    """Whether a column named ``ext`` may hold what ``auto`` stores (``id`` may not hold text)."""
    groups = (TEXT_EXTS, INT_EXTS, frozenset({"json", "jsn"}), frozenset({"npy"}))
    for group in groups:
        if ext in group or auto in group:
            return ext in group and auto in group
    return True


def auto_field(column: str, ext: str) -> str:
    """The automatic field of ``column`` storing ``ext``: the JSONL rule, unless the column's
    name is an extension that cannot hold it (a text column ``id`` gives ``id.txt``).

    Example:
        >>> auto_field("caption", "txt"), auto_field("txt", "txt"), auto_field("id", "txt")
        ('caption.txt', 'txt', 'id.txt')
    """
    name = member_name(column, ext)
    last = name.rpartition(".")[2]
    return name if "." in name or _fits(last, field_ext(ext)) else f"{name}.{field_ext(ext)}"


def parse_columns(spec: str | dict[str, str] | None) -> dict[str, str] | None:
    """``--columns image=jpg,caption=txt`` -> ``{"image": "jpg", "caption": "txt"}``.

    A dict passes through (checked); a name without ``=`` maps to ``""`` (automatic field).

    Raises:
        ConfigError: an empty name or field, a column named twice.
    """
    if spec is None:
        return None
    if not isinstance(spec, (str, dict)):
        raise ConfigError(f"columns={spec!r}: write the columns as image=jpg,caption=txt or as a dict of them")
    items = spec.items() if isinstance(spec, dict) else (
        (part.partition("=")[0], part.partition("=")[2]) for part in str(spec).split(","))
    out: dict[str, str] = {}
    for col, fld in items:
        if not isinstance(col, str) or not isinstance(fld, str):
            raise ConfigError(f"columns={spec!r}: map column names to field names, both strings, e.g. "
                              "{'image': 'jpg', 'caption': 'txt'} or image=jpg,caption=txt")
        col, fld = col.strip(), fld.strip()
        if not col:
            raise ConfigError(f"columns={spec!r}: an empty column name; write e.g. image=jpg,caption=txt")
        if col in out:
            raise ConfigError(f"columns={spec!r}: column {col!r} is named twice; name it once")
        if any(c in fld for c in "/\n\r\0") or fld.startswith(".") or fld.endswith("."):
            raise ConfigError(f"columns={spec!r}: {fld!r} cannot be a field name; write an extension "
                              "such as jpg, txt or caption.txt")
        out[col] = field_ext(fld) if fld else ""
    if not out:
        raise ConfigError(f"columns={spec!r} names no column; write e.g. image=jpg,caption=txt")
    return out


def _kind(typ: Any) -> str | None:
    import pyarrow as pa

    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if pa.types.is_null(typ):
        return None
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return "text"
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ):
        return "binary"
    if pa.types.is_struct(typ) and typ.get_field_index("bytes") >= 0:
        inner = typ.field("bytes").type
        if pa.types.is_binary(inner) or pa.types.is_large_binary(inner):
            return "media"
    if pa.types.is_boolean(typ) or pa.types.is_integer(typ) or pa.types.is_floating(typ):
        return "scalar"
    value = typ
    while pa.types.is_list(value) or pa.types.is_large_list(value) or pa.types.is_fixed_size_list(value):
        value = value.value_type
    if value is not typ and (pa.types.is_integer(value) or pa.types.is_floating(value)
                             or pa.types.is_boolean(value)):
        return "array"
    return "other"


_AUTO_EXT = {"text": "txt", "scalar": "json", "array": "npy", "other": "json"}


def resolve_columns(schema: Any, columns: dict[str, str] | None, key: str | None,
                    where: str) -> tuple[ColumnField, ...]:
    """The fields of a table with ``schema`` (a ``pyarrow.Schema``), in column order.

    ``key`` (the ``__key__`` column) is not packed as a field. ``where`` names the source
    in messages.

    Raises:
        ConfigError: a column of ``columns`` or ``key`` is not in the table (the message
            lists the columns there are), two columns map to one field, or nothing is left.
    """
    import pyarrow as pa

    names = list(schema.names)
    available = ", ".join(names) or "(none)"
    for col in [*(columns or {}), *([key] if key else [])]:
        if col not in names:
            raise ConfigError(f"{where}: no column {col!r}; the columns are: {available}")
    chosen = list(columns) if columns is not None else [n for n in names if n != key]
    out: list[ColumnField] = []
    seen: dict[str, str] = {}
    for col in chosen:
        kind = _kind(schema.field(col).type)
        if kind is None:
            if columns is not None:
                raise ConfigError(f"{where}: column {col!r} holds only nulls; leave it out of columns")
            continue
        fld = (columns or {}).get(col, "")
        if not fld and kind in _AUTO_EXT:
            integer = kind == "scalar" and pa.types.is_integer(schema.field(col).type)
            fld = col.lower() if integer and col.lower() in INT_EXTS else auto_field(col, _AUTO_EXT[kind])
        if fld and fld in seen:
            raise ConfigError(f"{where}: columns {seen[fld]!r} and {col!r} both map to field {fld!r}; "
                              "rename one with --columns COLUMN=FIELD")
        seen[fld or col] = col
        out.append(ColumnField(col, fld, kind))
    if not out:
        raise ConfigError(f"{where}: no column to pack; the columns are: {available}")
    return tuple(out)


def media_ext(data: bytes, path: str | None = None) -> str:
    """The field extension of binary ``data``: sniffed image or audio type, else ``path``'s
    extension, else ``bin``.

    Example:
        >>> media_ext(b"\\x89PNG\\r\\n\\x1a\\n...."), media_ext(b"RIFF....WAVEfmt "), media_ext(b"?", "a.FLAC")
        ('png', 'wav', 'flac')
    """
    image = sniff(data[:32])
    if image is not None:
        return _SNIFFED[image]
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    if data[:3] == b"ID3" or data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return "mp3"
    if path:
        ext = os.path.splitext(path)[1][1:]
        if ext.isalnum():
            return field_ext(ext)
    return "bin"


def _npy(value: Any) -> bytes:
    try:
        arr = np.asarray(value)
    except ValueError:  # numpy refuses ragged nested lists
        arr = np.empty(0, dtype=object)
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise ValueError("a ragged or non-numeric list cannot be stored as .npy; map the column to json")
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _json_default(value: Any) -> str:
    """Dates, decimals and the like as text; bytes refused (``str`` would store ``"b'...'"``)."""
    if isinstance(value, (bytes, bytearray)):
        raise ValueError("binary data cannot be stored as JSON; map the column to bin or an image extension")
    return str(value)


def _json(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return _json_default(value).encode()
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                      default=_json_default).encode("utf-8")


def encode(field: str, value: Any) -> bytes:
    """Store one value under ``field``; the field's last extension decides how.

    Raises:
        ValueError: the value cannot be stored so (the message says why).
    """
    ext = field.rpartition(".")[2]
    if ext in TEXT_EXTS:
        if isinstance(value, (bytes, bytearray)):
            bytes(value).decode("utf-8")  # raises UnicodeDecodeError (a ValueError)
            return bytes(value)
        return (value if isinstance(value, str) else _json(value).decode("utf-8")).encode("utf-8")
    if ext in INT_EXTS:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{field} holds an integer, got {type(value).__name__} {str(value)[:40]!r}")
        return str(int(value)).encode("ascii")
    if ext in ("json", "jsn"):
        return _json(value)
    if ext == "npy":
        return _npy(value)
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, (bytes, bytearray)):
        raise ValueError(f"{field} stores bytes, got {type(value).__name__}; map the column to json or npy")
    if ext in IMAGE_EXTS and sniff(bytes(value[:32])) is None:
        raise ValueError(f"not an image (starts with {bytes(value[:8])!r})")
    return bytes(value)
