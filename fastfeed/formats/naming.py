"""Names inside a shard: the one sample-key rule and the one set of image extensions.

Every part of fastfeed that turns a file or member name into (sample key, field) calls
:func:`split_key`: ``pack`` grouping files, the tar readers, the scan of WebDataset tars
without an index, and ``verify``. It is WebDataset's convention (``base_plus_ext`` and
the metadata rule of its tar iterator):

- the key is the path up to the first dot of the base name, the field is the rest,
  lower-cased (``a/b/0001.seg.PNG`` -> ``a/b/0001``, ``seg.png``);
- a name with no dot in its base name has no key (``a/README``);
- a base name that starts with a dot takes its folder as the key when that folder's
  name has no dot (``a/b/.x.txt`` -> ``a/b/``, ``x.txt``), as WebDataset does; fastfeed
  treats such names as hidden files (:func:`is_hidden`): ``pack`` never packs them and
  the scan of foreign tars skips them and reports them (``index.skipped``);
- members under a top-level ``__dunder__`` folder, and a bare ``__dunder__`` file, are
  metadata, not samples: no key.

:data:`IMAGE_EXTENSIONS` are the field extensions (last dot-separated part, lower case)
that hold images: ``pack`` checks them, ``verify`` decodes them, the loader hands them to
the image decoder and :func:`fastfeed.decode.fields.decode_field` passes them through.

Example:
    >>> split_key("a/b/0001.seg.PNG"), split_key("a/README"), split_key("__meta__/x.json")
    (('a/b/0001', 'seg.png'), None, None)
    >>> is_image("left.JPEG"), is_image("png.gz"), field_ext("x.JPEG")
    (True, False, 'x.jpg')
"""

from __future__ import annotations

import re
from typing import Iterable

__all__ = ["IMAGE_EXTENSIONS", "PREFERRED_IMAGE_FIELDS", "RAW_FIELD", "field_ext", "holds_pixels", "is_hidden", "is_image", "is_metadata",
           "last_ext", "pick_image_field", "split_key"]

# WebDataset's tar iterator skips these before making keys (its ``meta_prefix/suffix``).
_META = re.compile(r"__[^/]*__($|/)")
# WebDataset's base_plus_ext: the longest "<folders>/" prefix after which a run of
# non-dots, a dot and a slash-free rest end the name.
_BASE_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")

#: Field extensions holding images: still-image formats Pillow reads (HEIC/HEIF need the
#: ``pillow-heif`` plugin to decode), aliases included (``jpeg`` as well as ``jpg``).
IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    "jpg jpeg jpe jfif png apng gif bmp dib webp tif tiff ppm pgm pbm pnm tga ico "
    "jp2 j2k jpx jpc jpf j2c psd sgi rgb rgba bw pcx avif heic heif".split()
)
#: The field of an image stored as pixels (``pack --store raw``): uint8 RGB, height x width x 3, row-major
#: (HWC), no header; the shape is in the index (``shapes.npy``). Not an image *file* extension: nothing
#: but fastfeed's raw store writes it, and :func:`is_image` is False for it.
RAW_FIELD = "rgb8"
#: ``pack`` stores these aliases under one field name (``a.jpeg`` and ``a.jpg`` -> ``jpg``).
_ALIASES = {"jpeg": "jpg", "jpe": "jpg", "jfif": "jpg", "tiff": "tif"}


def split_key(name: str) -> tuple[str, str] | None:
    """Split a member or file path into (key, field) the WebDataset way; None: no sample.

    Example:
        >>> split_key("compressed/0001.txt.gz"), split_key("a.b/c.Seg.PNG")
        (('compressed/0001', 'txt.gz'), ('a.b/c', 'seg.png'))
        >>> split_key("a/b/.x.txt"), split_key("noext")
        (('a/b/', 'x.txt'), None)
    """
    if is_metadata(name):
        return None
    m = _BASE_EXT.match(name)
    if m is None:
        return None
    return m.group(1), m.group(2).lower()


def is_metadata(name: str) -> bool:
    """True for names under a top-level ``__dunder__`` folder, or a bare ``__dunder__`` file.

    Example:
        >>> is_metadata("__meta__/x.json"), is_metadata("__index__"), is_metadata("a/__x__/y.jpg")
        (True, True, False)
    """
    return _META.match(name) is not None


def is_hidden(name: str) -> bool:
    """True when the base name starts with a dot (``train/._0001.jpg``, ``.DS_Store``).

    Example:
        >>> is_hidden("a/b/.x.txt"), is_hidden("a/.b/c.jpg")
        (True, False)
    """
    return name.rpartition("/")[2].startswith(".")


def last_ext(field: str) -> str:
    """The part of a field name that names its type (``"seg.png"`` -> ``"png"``), lower case.

    Example:
        >>> last_ext("seg.PNG"), last_ext("txt.gz"), last_ext("cls")
        ('png', 'gz', 'cls')
    """
    return field.rsplit(".", 1)[-1].lower()


def is_image(field: str) -> bool:
    """True when the field holds an image (``jpg``, ``seg.png``...); ``png.gz`` does not.

    Example:
        >>> is_image("jpg"), is_image("left.png"), is_image("png.gz"), is_image("txt")
        (True, True, False, False)
    """
    return last_ext(field) in IMAGE_EXTENSIONS


def field_ext(field: str) -> str:
    """Lower-case a field name and normalise the alias of its last part (``jpeg`` -> ``jpg``).

    Example:
        >>> field_ext("seg.JPEG"), field_ext("TIFF")
        ('seg.jpg', 'tif')
    """
    field = field.lower()
    head, dot, last = field.rpartition(".")
    return f"{head}{dot}{_ALIASES.get(last, last)}"


def holds_pixels(field: str) -> bool:
    """True for a field the CPU loader turns into ``"image"``: an image file or raw pixels (:data:`RAW_FIELD`).

    Example:
        >>> holds_pixels("jpg"), holds_pixels("rgb8"), holds_pixels("txt")
        (True, True, False)
    """
    return field == RAW_FIELD or is_image(field)


#: The image fields :func:`pick_image_field` prefers, in order.
PREFERRED_IMAGE_FIELDS = (RAW_FIELD, "jpg", "jpeg", "png", "webp")


def pick_image_field(fields: Iterable[str]) -> str | None:
    """The field the CPU loader decodes as ``"image"`` (and ``pack --store raw`` stores as pixels):
    rgb8 (raw pixels), jpg, jpeg, png, webp first, then the first image field by name.

    Example:
        >>> pick_image_field(["cls", "png", "jpg"]), pick_image_field(["txt"]), pick_image_field(["rgb8"])
        ('jpg', None, 'rgb8')
    """
    fields = list(fields)
    for ext in PREFERRED_IMAGE_FIELDS:
        if ext in fields:
            return ext
    images = sorted(f for f in fields if is_image(f))
    return images[0] if images else None
