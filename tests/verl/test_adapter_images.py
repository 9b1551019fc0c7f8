"""Vision-language trajectories through the verl adapter, on real verl objects and real workers.

A verl ``AgentLoopOutput`` with a PIL image in ``multi_modal_data`` (and the image in the chat, as
verl 0.9.1's RLHFDataset puts it) goes through ``RewardqAgentLoopWorker._compute_score``:

* geometry3k scores exactly as verl's own ``default_compute_score`` scores it;
* a manager sees the very bytes the producer encoded (Pillow's PNG of the image);
* a vision-language judge (genrm against the stand-in server) receives it as a data URL;
* an oversize image is refused at the producer, naming the output and the image.
"""

from __future__ import annotations

import hashlib
import io
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from rewardq.errors import ScoringError
from rewardq.integrations.verl.media import wire_media, wire_raw_prompt
from tests.conftest import REDIS_URL, _delete_namespace
from tests.support.cli_procs import Procs
from tests.support.judge_standin import JudgeStandin
from tests.support.sync_client import SyncClient
from tests.verl.conftest import Fleet, start_fleet
from tests.verl.data import output, row, verl_expected
from tests.verl.test_adapter import adapter


def picture(color: tuple[int, int, int] = (200, 40, 40), size: tuple[int, int] = (48, 32)) -> Image.Image:
    return Image.new("RGB", size, color)


def png_of(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def vl_trajectory(image: Image.Image, response: str, truth: str = "3") -> tuple[list[AgentLoopOutput], dict[str, Any]]:
    """A one-output geometry3k trajectory whose prompt holds ``image``, as verl's agent loop makes it."""
    out = output(response, prompt="<image>Find x.")
    out.multi_modal_data = {"images": [image]}
    kwargs = row("hiyouga/geometry3k", truth)
    kwargs["raw_prompt"] = [
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "Find x."}]}
    ]
    return [out], kwargs


def oversize_png(total: int = 17 * 1024 * 1024) -> bytes:
    """A valid PNG of ``total`` bytes (over the default max_image_bytes, 16 MiB): a small image
    followed by an ancillary chunk of padding, which decoders skip."""
    small = png_of(picture())
    pad = b"\0" * (total - len(small) - 12)
    chunk = struct.pack(">I", len(pad)) + b"ruBb" + pad
    chunk += struct.pack(">I", zlib.crc32(b"ruBb" + pad) & 0xFFFFFFFF)
    return small[:-12] + chunk + small[-12:]


@pytest.fixture(scope="module")
def digest_fleet(module_procs: Procs, module_redis: SyncClient) -> Iterator[Fleet]:
    """A worker whose manager reports the images it received (tests.support.image_managers:ImageEcho)."""
    fleet = start_fleet(
        module_procs, module_redis, "--manager", "tests.support.image_managers:ImageEcho", "--tokenizer", "builtin:demo"
    )
    yield fleet
    for w in fleet.workers:
        w.terminate()
    _delete_namespace(REDIS_URL, fleet.namespace)


@pytest.mark.parametrize("response,truth", [("<think>x is 3</think> \\boxed{3}", "3"), ("\\boxed{4}", "3")])
async def test_geometry3k_with_images_scores_exactly_as_verl(
    monkeypatch: pytest.MonkeyPatch, naive_fleet: Fleet, response: str, truth: str
) -> None:
    w = adapter(monkeypatch, naive_fleet.namespace)
    outputs, kwargs = vl_trajectory(picture(), response, truth)
    await w._compute_score(outputs, kwargs=kwargs)
    score, extra = verl_expected(outputs, kwargs)
    final = outputs[-1]
    assert final.extra_fields["reward_error"] is None, final.extra_fields["reward_error"]
    assert (final.reward_score, final.extra_fields["reward_extra_info"]) == (score, extra)


async def test_the_manager_sees_the_identical_image_bytes(monkeypatch: pytest.MonkeyPatch, digest_fleet: Fleet) -> None:
    w = adapter(monkeypatch, digest_fleet.namespace)
    image = picture((10, 120, 250))
    outputs, kwargs = vl_trajectory(image, "\\boxed{3}")
    await w._compute_score(outputs, kwargs=kwargs)
    info = outputs[-1].extra_fields["reward_extra_info"]
    assert outputs[-1].extra_fields["reward_error"] is None, outputs[-1].extra_fields["reward_error"]
    assert info["sha256"] == hashlib.sha256(png_of(image)).hexdigest() and info["formats"] == "png"
    assert info["pixel"] == [10, 120, 250]  # decoding them gives the very pixels
    assert info["question"] == "Find x."  # the chat came along, its image part a placeholder
    jpeg = io.BytesIO()
    image.save(jpeg, format="JPEG")
    outputs, kwargs = vl_trajectory(image, "\\boxed{3}")
    outputs[-1].multi_modal_data = {"images": [jpeg.getvalue()]}  # encoded bytes go as they are
    await w._compute_score(outputs, kwargs=kwargs)
    assert outputs[-1].extra_fields["reward_extra_info"]["sha256"] == hashlib.sha256(jpeg.getvalue()).hexdigest()


async def test_a_vision_judge_receives_the_image_as_a_data_url(
    monkeypatch: pytest.MonkeyPatch, module_procs: Procs, module_redis: SyncClient, tmp_path: Path
) -> None:
    judge = JudgeStandin(tmp_path)
    fleet = None
    try:
        fleet = start_fleet(
            module_procs,
            module_redis,
            "--manager",
            "genrm",
            "--tokenizer",
            "builtin:demo",
            "--manager-option",
            f"base_url={judge.base_url}",
            "--manager-option",
            "model=vl-judge",
            tag="vl",
        )
        w = adapter(monkeypatch, fleet.namespace)
        image = picture((1, 2, 3))
        outputs, kwargs = vl_trajectory(image, "x = 3 grade=0.75")
        await w._compute_score(outputs, kwargs=kwargs)
        assert outputs[-1].reward_score == 0.75, outputs[-1].extra_fields
        sent = png_of(image)
        assert judge.stats()["images"] == [
            {"mime": "image/png", "size": len(sent), "sha256": hashlib.sha256(sent).hexdigest()}
        ]
        [body] = judge.bodies()
        assert "Find x." in body["messages"][-1]["content"][-1]["text"]  # the question, from the chat
    finally:
        judge.stop()
        if fleet is not None:
            for p in fleet.workers:
                p.terminate()
            _delete_namespace(REDIS_URL, fleet.namespace)


async def test_an_oversize_image_is_refused_at_the_producer_by_name(
    monkeypatch: pytest.MonkeyPatch, naive_fleet: Fleet, module_redis: SyncClient
) -> None:
    big = oversize_png()
    w = adapter(monkeypatch, naive_fleet.namespace)
    outputs, kwargs = vl_trajectory(picture(), "\\boxed{3}")
    outputs[-1].multi_modal_data = {"images": [png_of(picture()), big]}
    stream = f"{naive_fleet.namespace}:{{s0}}:stream"
    before = module_redis.xlen(stream)
    await w._compute_score(outputs, kwargs=kwargs)
    error = outputs[-1].extra_fields["reward_error"]
    assert outputs[-1].reward_score == 0.0 and "could not be sent" in error, error
    assert f"multi_modal_data.images[1]: output 0, image 1 is {len(big)} bytes, more than max_image_bytes" in error
    assert module_redis.xlen(stream) <= before  # nothing was sent
    strict = adapter(monkeypatch, naive_fleet.namespace, REWARDQ_VERL_ON_ERROR="raise")
    outputs[-1].reward_score = None
    with pytest.raises(ScoringError, match="output 0, image 1"):
        await strict._compute_score(outputs, kwargs=kwargs)


def test_what_goes_over_the_wire_of_verls_media() -> None:
    img = picture()
    assert wire_media({"images": [img], "videos": [object()], "audios": [b"x"]}) == {"images": [img]}
    assert wire_media({"videos": ["/v.mp4", ["/f1.jpg", "/f2.jpg"]]}) == {"videos": ["/v.mp4", ["/f1.jpg", "/f2.jpg"]]}
    assert wire_media({"audios": [b"x"]}) is None and wire_media(None) is None
    chat = [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "Find x."}]}]
    assert wire_raw_prompt(chat) == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x."}]}
    ]
    plain = [{"role": "user", "content": "hi"}]
    assert wire_raw_prompt(plain) is plain
