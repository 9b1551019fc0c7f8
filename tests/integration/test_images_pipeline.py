"""Images through the whole pipeline on the real Redis: a manager sees the very bytes the producer
sent, a text-only manager never decodes them, and a raw entry carrying a bad image ends as an
error result for every key of its trajectory plus a dead letter."""

from __future__ import annotations

import asyncio
import hashlib
import io
from typing import Any

import msgpack
import pytest
from PIL import Image

from rewardq import RecordError, RewardClient
from rewardq.queue.codec import encode_output
from rewardq.queue.keys import Keyspace
from tests.support.helpers import SAMPLE, output, running_workers
from tests.support.image_managers import ImageDigests
from tests.support.sync_client import SyncClient


def png(color: tuple[int, int, int], size: tuple[int, int] = (24, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


async def test_the_manager_sees_the_bytes_the_producer_sent(ns: str, redis_url: str) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    jpg = io.BytesIO()
    Image.new("RGB", (20, 20), (5, 200, 5)).save(jpg, format="JPEG")
    pil = Image.new("RGBA", (9, 7), (1, 2, 3, 4))
    sent = [[png((255, 0, 0))], [], [jpg.getvalue(), pil]]
    outs = [output(3, 3, seed=i, multi_modal_data={"images": imgs} if imgs else None) for i, imgs in enumerate(sent)]
    keys = client.put_trajectory("img", "s", outs, SAMPLE)
    async with running_workers(ns, redis_url, [ImageDigests(None)]):
        res = await asyncio.to_thread(client.wait_rewards, keys, 20)
    expected = [[png((255, 0, 0))], [], [jpg.getvalue(), png_of(pil)]]
    for key, want in zip(keys, expected):
        r = res[key]
        assert r.status == "ok" and r.reward_score == len(want), r
        assert r.reward_extra_info["sha256"] == ",".join(hashlib.sha256(b).hexdigest() for b in want)
        assert r.reward_extra_info["decoded"] is False and r.reward_extra_info["all_encoded"] is True
    assert res[keys[2]].reward_extra_info["formats"] == "jpeg,png"
    client.close()


def png_of(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_the_producer_refuses_an_oversize_image_naming_output_and_image(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns, max_image_bytes=200)
    big = png((1, 2, 3), size=(400, 400))
    assert len(big) > 200 > len(png((0, 0, 0), (2, 2)))
    outs = [output(3, 3), output(3, 3, multi_modal_data={"images": [png((0, 0, 0), (2, 2)), big]})]
    with pytest.raises(RecordError) as err:
        client.put_trajectory("big", "s", outs, SAMPLE)
    assert err.value.field == "multi_modal_data.images[1]" and "output 1, image 1" in str(err.value)
    assert sync_redis.xlen(Keyspace(ns).stream(0)) == 0  # nothing was sent
    client.close()


def forged(index: int, final: bool, image: bytes) -> bytes:
    """A record as a producer that skipped the checks (or a hand-written XADD) would send it."""
    rec = msgpack.unpackb(
        encode_output("forged", "s", index, output(3, 3, seed=index), SAMPLE, final=final),
        raw=False,
        ext_hook=msgpack.ExtType,
    )
    rec["multi_modal_data"] = {"images": [image]}
    result: bytes = msgpack.packb(rec, use_bin_type=True)
    return result


@pytest.mark.parametrize(
    "image,reason",
    [
        (b"<html>not an image</html>", "not a PNG, JPEG or WebP image"),
        (png((9, 9, 9))[:-20], "cut or damaged PNG"),
        (png((9, 9, 9), size=(300, 300)), "more than max_image_bytes=600"),
    ],
    ids=["garbage", "cut", "oversize"],
)
async def test_a_raw_entry_carrying_a_bad_image_fails_every_key_and_is_dead_lettered(
    ns: str, redis_url: str, sync_redis: SyncClient, image: Any, reason: str
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    good = client.put_trajectory("good", "s", [output(3, 3, multi_modal_data={"images": [png((1, 1, 1))]})], SAMPLE)
    first = encode_output("forged", "s", 0, output(3, 3), SAMPLE, final=False)
    sync_redis.xadd(ks.stream(0), {"key": "forged_s_0", "data": first, "ts": "0"})
    sync_redis.xadd(ks.stream(0), {"key": "forged_s_1", "data": forged(1, True, image), "ts": "0"})
    async with running_workers(ns, redis_url, [ImageDigests(None)], max_image_bytes=600):
        res = await asyncio.to_thread(client.wait_rewards, ["forged_s_0", "forged_s_1", *good], 20)
    for key in ("forged_s_0", "forged_s_1"):
        assert res[key].status == "error" and "multi_modal_data.images[0]" in (res[key].error or ""), res[key]
        assert reason in (res[key].error or "") or key == "forged_s_0"
    assert reason in (res["forged_s_1"].error or "")
    assert res[good[0]].status == "ok" and res[good[0]].reward_score == 1.0  # the neighbour scored
    dead = {f[b"kind"]: f for _, f in sync_redis.xrange(ks.dead(0))}
    assert reason.encode() in dead[b"invalid"][b"reason"]  # the record with the image, as it arrived
    # output 0, when read after its trajectory had failed, is dead-lettered too (as any late output is)
    assert set(dead) <= {b"invalid", b"conflict"}
    client.close()
