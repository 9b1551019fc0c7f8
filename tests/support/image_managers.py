"""Managers that report the images they received, for tests of images on the wire.

Loaded by worker processes as ``--manager tests.support.image_managers:ImageEcho``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from rewardq.queue.images import EncodedImage, images_of
from rewardq.reward.base import RewardManager
from rewardq.reward.judge.prompt import question_from
from rewardq.reward.rows import non_tensor


def report(images: list[Any]) -> dict[str, Any]:
    """What a row's images were: their SHA-256, formats, whether any was decoded, and all EncodedImage."""
    return {
        "sha256": ",".join(hashlib.sha256(img.data).hexdigest() for img in images),
        "formats": ",".join(img.format for img in images),
        "decoded": any(img._pil is not None for img in images),
        "all_encoded": all(isinstance(img, EncodedImage) for img in images),
    }


class ImageDigests(RewardManager):
    """Rewards each output with its image count; reports its images (:func:`report`)."""

    async def run_single(self, data: Any) -> list[dict[str, Any]]:
        out = []
        for i in range(data.batch_size[0]):
            images = images_of(non_tensor(data[i : i + 1], "multi_modal_data"))
            out.append({"reward_score": float(len(images)), "reward_extra_info": report(images)})
        return out


class ImageEcho(RewardManager):
    """Scores 1.0 and reports the final output's images (:func:`report`), the first one's top-left
    pixel once decoded, and the question read from the sample's chat."""

    async def run_single(self, data: Any) -> dict[str, Any]:
        row = data[-1:]
        images = images_of(non_tensor(row, "multi_modal_data"))
        info = report(images)
        info["pixel"] = list(images[0].to_pil().getpixel((0, 0))) if images else []
        info["question"] = question_from(non_tensor(row, "raw_prompt"), {}, lambda: "")
        return {"reward_score": 1.0, "reward_extra_info": info}
