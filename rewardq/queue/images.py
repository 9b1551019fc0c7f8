"""Images (and video paths) on the wire: encoded bytes as msgpack binary, never pickle, never pixels.

A record's ``multi_modal_data`` (an output's own, as verl's ``AgentLoopOutput.multi_modal_data``
holds it, and the dataset's ``multi_modal_data`` column in ``sample``) is a map::

    {"images": [bin, ...], "videos": [path | [frame path, ...], ...]}    ("image" / "video" too)

* **Images** travel as their encoded bytes: PNG, JPEG or WebP (:data:`FORMATS`). The producer
  encodes each once (:func:`encode_image`): encoded bytes are sent as they are; a PIL image,
  a numpy array, or a file in another format (with Pillow installed: ``rewardq[vision]``) is
  encoded to PNG; a path, ``file://`` URL or ``data:`` URL is read. With Pillow the producer
  decodes each image it was handed as bytes, so an undecodable one fails there, before anything
  is sent. Each image is at most ``max_image_bytes``, and the record at most ``max_record_bytes``.
* **Videos** travel as the path of the video or of its frames (text): the worker never receives
  decoded frames.
* **The worker** checks each image without decoding it (:func:`check_image_bytes`: its format's
  signature and framing, and ``max_image_bytes``) and hands managers :class:`EncodedImage`
  objects, which decode only when asked (:meth:`EncodedImage.to_pil`): a text-only scorer pays
  nothing for them.

Every failure raises :class:`~rewardq.errors.RecordError` naming the output and the image index
(``multi_modal_data.images[2]: output 1, image 2 is 17.2 MiB, more than max_image_bytes ...``).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rewardq.errors import MissingExtra, RecordError

#: Largest encoded image (PNG/JPEG/WebP bytes) a record may carry, in bytes: producers refuse larger
#: ones naming the output and the image, workers dead-letter them. The record as a whole is also
#: bounded by MAX_RECORD_BYTES.
MAX_IMAGE_BYTES = 16 * 1024 * 1024


#: Formats an image may travel in, and their MIME types (what a chat request's data URL names).
FORMATS = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
IMAGE_KEYS = ("images", "image")
VIDEO_KEYS = ("videos", "video")
#: The keys a ``multi_modal_data`` map may hold.
KEYS = IMAGE_KEYS + VIDEO_KEYS
#: Images one output may carry (the decoder's list limit is far larger).
MAX_IMAGES = 1024
#: PNG can hold every mode Pillow images are in except these, which are converted first.
_PNG_CONVERT = {"CMYK": "RGB", "YCbCr": "RGB", "LAB": "RGB", "HSV": "RGB", "F": "I", "RGBa": "RGBA", "LA": "LA"}


class EncodedImage:
    """One image as it travelled: its encoded bytes and format. Immutable; decoded on demand.

    Attributes:
        data: the encoded bytes, exactly as the producer sent them.
        format: ``png``, ``jpeg`` or ``webp``.
    """

    __slots__ = ("data", "format", "_pil")

    def __init__(self, data: bytes, format: str) -> None:
        self.data = bytes(data)
        self.format = format
        self._pil: Any = None

    @property
    def mime(self) -> str:
        return FORMATS[self.format]

    def data_url(self) -> str:
        """``data:image/png;base64,...``: how a chat-completions request carries the image."""
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"

    def to_pil(self) -> Any:
        """The decoded ``PIL.Image`` (decoded once, on first call; needs Pillow: ``rewardq[vision]``)."""
        if self._pil is None:
            image = _pil_module().open(io.BytesIO(self.data))
            image.load()
            self._pil = image
        return self._pil

    def __len__(self) -> int:
        return len(self.data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EncodedImage) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"EncodedImage({self.format}, {len(self.data)} bytes)"

    def __copy__(self) -> EncodedImage:
        return self

    def __deepcopy__(self, memo: dict[str, object]) -> EncodedImage:
        return self  # immutable: a row's copy of the sample shares the bytes


def _pil_module() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise MissingExtra("Pillow (pip install 'rewardq[vision]')") from None
    return Image


def _has_pil() -> bool:
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


def sniff(data: bytes | bytearray | memoryview) -> str | None:
    """The format an image's bytes start with: ``png``, ``jpeg``, ``webp``, or None."""
    head = bytes(data[:12])
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


def check_image_bytes(data: object, where: Spot, max_image_bytes: int) -> str:
    """The format of one image's bytes, checked without decoding; RecordError naming ``where`` otherwise.

    Checks the size, the format's signature and its framing: a PNG starts with its IHDR chunk and
    ends with IEND, a JPEG ends with its end-of-image marker, a WebP's RIFF size is its length.
    A truncated or garbage image fails here; the decoder proper runs only when a manager asks.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise where.error(f"must be encoded image bytes, got {type(data).__name__}")
    size = len(data)
    if size > max_image_bytes:
        raise where.error(
            f"is {size} bytes, more than max_image_bytes={max_image_bytes}; send a smaller image "
            "(resize it, or JPEG/WebP) or raise max_image_bytes on producers and workers"
        )
    fmt = sniff(data)
    problem = None
    if fmt is None:
        problem = "is not a PNG, JPEG or WebP image (no known signature at its start)"
    elif fmt == "png" and (bytes(data[12:16]) != b"IHDR" or bytes(data[-8:-4]) != b"IEND"):
        problem = "is a cut or damaged PNG (no IHDR chunk first or no IEND chunk last)"
    elif fmt == "jpeg" and b"\xff\xd9" not in bytes(data[-1024:]):
        problem = "is a cut or damaged JPEG (no end-of-image marker)"
    elif fmt == "webp" and int.from_bytes(bytes(data[4:8]), "little") + 8 not in (size, size - 1):
        problem = "is a cut or damaged WebP (its RIFF size does not match its length)"
    if problem:
        raise where.error(problem)
    assert fmt is not None
    return fmt


# --------------------------------------------------------------------------------------
# producer side
# --------------------------------------------------------------------------------------


def encode_image(value: object, where: Spot, max_image_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """One image as the producer sends it: PNG, JPEG or WebP bytes (see the module doc)."""
    data = _image_bytes(value, where)
    if len(data) > max_image_bytes:  # before any decoding: an oversize image costs nothing more
        check_image_bytes(data, where, max_image_bytes)
    if _has_pil():
        data = _decoded_or_refused(data, sniff(data), where)
    check_image_bytes(data, where, max_image_bytes)
    return data


def _image_bytes(value: object, where: Spot) -> bytes:
    """The bytes an image value stands for (encoding it to PNG when it is pixels)."""
    if isinstance(value, EncodedImage):
        return value.data
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, Mapping):  # {"bytes": ..., "path": ...} (Hugging Face), {"image": ...} (a chat part)
        if value.get("bytes") is not None:
            return _image_bytes(value["bytes"], where)
        for name in ("image", "image_url", "url", "path"):
            inner = value.get(name)
            if isinstance(inner, Mapping) and "url" in inner:
                inner = inner["url"]
            if inner is not None:
                return _image_bytes(inner, where)
        raise where.error("is a dict without 'bytes', 'image', 'url' or 'path'")
    if isinstance(value, (str, os.PathLike)):
        return _read_reference(os.fspath(value), where)
    if _is_pil(value):
        return _png_of(value, where)
    if hasattr(value, "__array_interface__") or (hasattr(value, "detach") and hasattr(value, "numpy")):
        import numpy as np

        arr = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        try:
            return _png_of(_pil_module().fromarray(arr), where)
        except (TypeError, ValueError) as exc:
            raise where.error(f"is an array of shape {arr.shape}, not an image ({exc})") from None
    raise where.error(
        f"is a {type(value).__name__}; an image is encoded bytes (PNG/JPEG/WebP), a PIL image, "
        "a numpy array, a path, or a data: URL"
    )


def _read_reference(ref: str, where: Spot) -> bytes:
    if ref.startswith("data:"):
        head, sep, payload = ref.partition(",")
        if not sep or ";base64" not in head:
            raise where.error("is a data: URL that is not base64")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise where.error(f"is a data: URL with bad base64 ({exc})") from None
    path = ref[len("file://") :] if ref.startswith("file://") else ref
    if "://" in path:
        raise where.error(f"is the URL {ref[:80]!r}; send the image's bytes instead")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise where.error(f"cannot read {path!r} ({exc.strerror or exc})") from None


def _is_pil(value: object) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "save") and hasattr(value, "mode")


def _png_of(image: Any, where: Spot) -> bytes:
    """The image as Pillow's default PNG (``image.save(buf, "PNG")``): lossless, so a manager sees
    the very pixels, and the bytes are what anyone encoding the image the usual way gets."""
    mode = _PNG_CONVERT.get(image.mode)
    if mode is not None and mode != image.mode:
        image = image.convert(mode)
    buf = io.BytesIO()
    try:
        image.save(buf, format="PNG")
    except (OSError, ValueError) as exc:
        raise where.error(f"cannot be encoded as PNG ({exc})") from None
    return buf.getvalue()


def _decoded_or_refused(data: bytes, fmt: str | None, where: Spot) -> bytes:
    """Check ``data`` with Pillow: an image it cannot read is refused here; one in another format
    (GIF, BMP, TIFF, ...) is decoded and encoded to PNG.

    A PNG, JPEG or WebP is opened (its header parsed) and verified (a PNG's chunk checksums),
    not decoded: ~0.3 ms for a 200 KB PNG where a full decode takes ~9 ms, in the rollout's
    event loop. :func:`check_image_bytes` adds the framing checks (a cut image fails there).
    """
    Image = _pil_module()
    try:
        image = Image.open(io.BytesIO(data))
        if fmt is None:
            image.load()
        else:
            image.verify()
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for a bad image
        if fmt is None:
            raise where.error("is not a PNG, JPEG or WebP image, nor any other format Pillow reads") from None
        raise where.error(f"cannot be decoded as an image ({type(exc).__name__}: {exc})") from None
    return data if fmt is not None else _png_of(image, where)


def encode_multi_modal(
    value: object,
    *,
    output: int | None,
    name: str = "multi_modal_data",
    max_image_bytes: int = MAX_IMAGE_BYTES,
) -> dict[str, list[Any]] | None:
    """A ``multi_modal_data`` map as it goes on the wire (None when empty); RecordError naming the
    output and the entry that cannot go."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RecordError(name, f"must be a dict like {{'images': [...]}}, got {type(value).__name__}")
    out: dict[str, list[Any]] = {}
    for key, items in value.items():
        if key not in KEYS:
            raise _about(
                output,
                f"{name}.{key}",
                f"carries {key!r}; multi_modal_data may hold {', '.join(KEYS)} (audio is not carried)",
            )
        if items is None:
            continue
        listed = [items] if isinstance(items, (str, bytes, os.PathLike)) or not isinstance(items, Sequence) else items
        if key in IMAGE_KEYS:
            if len(listed) > MAX_IMAGES:
                raise _about(output, f"{name}.{key}", f"has {len(listed)} images; at most {MAX_IMAGES}")
            out[key] = [
                encode_image(item, _spot(name, key, i, output), max_image_bytes) for i, item in enumerate(listed)
            ]
        else:
            out[key] = [_video_path(item, _spot(name, key, i, output)) for i, item in enumerate(listed)]
    return out or None


def _video_path(item: object, where: Spot) -> str | list[str]:
    if isinstance(item, (str, os.PathLike)):
        return os.fspath(item)
    if isinstance(item, Mapping) and isinstance(item.get("video"), (str, os.PathLike, list)):
        return _video_path(item["video"], where)
    if isinstance(item, Sequence) and item and all(isinstance(f, (str, os.PathLike)) for f in item):
        return [os.fspath(f) for f in item]
    raise where.error(
        f"is a {type(item).__name__}; a video travels as the path of the video or a "
        "list of its frames' paths, never as decoded frames"
    )


# --------------------------------------------------------------------------------------
# worker side
# --------------------------------------------------------------------------------------


def decode_multi_modal(
    value: object,
    *,
    output: int | None,
    name: str = "multi_modal_data",
    max_image_bytes: int = MAX_IMAGE_BYTES,
) -> dict[str, list[Any]] | None:
    """A decoded record's ``multi_modal_data``, images as :class:`EncodedImage` (checked, not decoded)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecordError(name, f"must be a map, got {type(value).__name__}")
    out: dict[str, list[Any]] = {}
    for key, items in value.items():
        if key not in KEYS:
            raise _about(output, f"{name}.{key}", f"carries {key!r}; multi_modal_data may hold {KEYS}")
        if not isinstance(items, list):
            raise _about(output, f"{name}.{key}", f"must be a list, got {type(items).__name__}")
        if key in IMAGE_KEYS:
            if len(items) > MAX_IMAGES:
                raise _about(output, f"{name}.{key}", f"has {len(items)} images; at most {MAX_IMAGES}")
            images = []
            for i, data in enumerate(items):
                fmt = check_image_bytes(data, _spot(name, key, i, output), max_image_bytes)
                images.append(EncodedImage(data, fmt))
            out[key] = images
        else:
            for i, item in enumerate(items):
                ok = isinstance(item, str) or (isinstance(item, list) and all(isinstance(f, str) for f in item))
                if not ok:
                    raise _about(output, f"{name}.{key}[{i}]", f"video {i} must be a path or a list of frame paths")
            out[key] = list(items)
    return out or None


def with_sample_media(sample: object, *, output: int | None, max_image_bytes: int, decode: bool) -> Any:
    """``sample`` with its ``multi_modal_data`` column encoded for the wire (``decode=False``) or read
    back from it (``decode=True``); a sample without one is returned as it is."""
    if not isinstance(sample, Mapping) or sample.get("multi_modal_data") is None:
        return sample
    convert = decode_multi_modal if decode else encode_multi_modal
    media = convert(
        sample["multi_modal_data"], output=output, name="sample.multi_modal_data", max_image_bytes=max_image_bytes
    )
    return {**sample, "multi_modal_data": media}


def images_of(multi_modal_data: object) -> list[EncodedImage]:
    """Every :class:`EncodedImage` of a decoded ``multi_modal_data`` map, in order (``[]`` for none)."""
    if not isinstance(multi_modal_data, Mapping):
        return []
    return [img for key in IMAGE_KEYS for img in multi_modal_data.get(key) or () if isinstance(img, EncodedImage)]


# -- naming what failed: "multi_modal_data.images[2]" and "output 1, image 2" -------------
@dataclass(frozen=True)
class Spot:
    """Where an entry of ``multi_modal_data`` sits, for error messages."""

    field: str
    output: int | None = None
    index: int | None = None
    kind: str = "image"

    @property
    def label(self) -> str:
        what = self.kind if self.index is None else f"{self.kind} {self.index}"
        return what if self.output is None else f"output {self.output}, {what}"

    def error(self, problem: str) -> RecordError:
        return RecordError(self.field, f"{self.label} {problem}", names_output=self.output is not None)


def _spot(name: str, key: str, i: int, output: int | None) -> Spot:
    return Spot(f"{name}.{key}[{i}]", output, i, "image" if key in IMAGE_KEYS else "video")


def _who(output: int | None) -> str:
    return "" if output is None else f"output {output} "


def _about(output: int | None, field: str, problem: str) -> RecordError:
    """A RecordError saying ``problem`` of ``output`` (when known); one that names its output is not
    named again by :meth:`RecordError.naming`."""
    return RecordError(field, _who(output) + problem, names_output=output is not None)
