"""What of a verl trajectory's images and videos goes to the fleet, and how; no verl import here.

verl keeps images in three places, and rewardq pushes each the way a record carries images
(:mod:`rewardq.queue.images`: encoded bytes, never pickle):

* ``AgentLoopOutput.multi_modal_data`` (``{"images": [PIL.Image, ...], "videos": [...], "audios":
  [...]}``): the images the policy saw, per output. Its images are pushed; videos go as the paths
  of the video or its frames when that is what they are (the rollout decodes them into frame
  tensors, which are left out, as are audios: a worker never receives decoded media).
* the dataset's ``multi_modal_data`` column (older verl datasets, custom ones): pushed the same way,
  as the sample's column.
* ``raw_prompt``: verl 0.9.1's ``RLHFDataset`` puts each image in the chat itself
  (``{"type": "image", "image": <PIL.Image>}``). The chat goes with its text, each image part
  replaced by ``{"type": "image"}`` (the images travel in ``multi_modal_data``), so scorers and
  judges read the question; before, the whole ``raw_prompt`` column was left out because a PIL
  image cannot go over msgpack.

A trajectory without images is pushed exactly as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rewardq.queue.images import IMAGE_KEYS, VIDEO_KEYS

logger = logging.getLogger("rewardq.verl")

#: Content parts of a chat message that carry media rather than text.
MEDIA_PARTS = frozenset({"image", "image_url", "video", "video_url", "audio", "input_audio"})


def wire_media(multi_modal_data: object) -> dict[str, list[object]] | None:
    """The part of a ``multi_modal_data`` map that goes over the wire: its images as they are (the
    producer encodes them), its videos that are paths; None when nothing is left."""
    if not isinstance(multi_modal_data, Mapping):
        return None
    out: dict[str, list[Any]] = {}
    left_out: list[str] = []
    for key, items in multi_modal_data.items():
        if items is None:
            continue
        listed = list(items) if isinstance(items, (list, tuple)) else [items]
        if key in IMAGE_KEYS:
            out[key] = listed
        elif key in VIDEO_KEYS:
            paths = [v for v in listed if _is_path(v)]
            if len(paths) < len(listed):
                left_out.append(f"{len(listed) - len(paths)} decoded video(s)")
            if paths:
                out[key] = paths
        else:
            left_out.append(str(key))
    if left_out:
        logger.debug("rewardq: multi_modal_data entries not sent (workers take images and video paths): %s", left_out)
    return {k: v for k, v in out.items() if v} or None


def _is_path(value: object) -> bool:
    if isinstance(value, (str, os.PathLike)):
        return True
    if isinstance(value, Mapping):
        return _is_path(value.get("video"))
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(f, (str, os.PathLike)) for f in value)


def wire_raw_prompt(raw_prompt: object) -> object:
    """``raw_prompt`` with every media part of its messages replaced by ``{"type": <kind>}``; a chat
    without media parts is returned as it is (the same object)."""
    if isinstance(raw_prompt, Sequence) and not isinstance(raw_prompt, (str, bytes)):
        messages = list(raw_prompt)
    elif hasattr(raw_prompt, "tolist"):  # verl hands columns as numpy object arrays
        messages = list(raw_prompt.tolist())
    else:
        return raw_prompt
    if not any(_has_media(m) for m in messages):
        return raw_prompt
    return [_without_media(m) for m in messages]


def _has_media(message: object) -> bool:
    content = message.get("content") if isinstance(message, Mapping) else None
    return isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") in MEDIA_PARTS for p in content)


def _without_media(message: Any) -> object:
    if not _has_media(message):
        return message
    parts = [
        {"type": str(p["type"])} if isinstance(p, Mapping) and p.get("type") in MEDIA_PARTS else p
        for p in message["content"]
    ]
    return {**message, "content": parts}


def wire_sample_media(sample: Mapping[str, object]) -> dict[str, object]:
    """The dataset row with its ``multi_modal_data`` column and its ``raw_prompt`` as they go over the wire."""
    out = dict(sample)
    if "multi_modal_data" in out:
        media = wire_media(out["multi_modal_data"])
        if media is None:
            del out["multi_modal_data"]
        else:
            out["multi_modal_data"] = media
    if "raw_prompt" in out:
        out["raw_prompt"] = wire_raw_prompt(out["raw_prompt"])
    return out


def has_media(outputs: Sequence[object]) -> bool:
    """Whether any output carries ``multi_modal_data``."""
    return any(getattr(o, "multi_modal_data", None) for o in outputs)
