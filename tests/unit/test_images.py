"""Images in records (rewardq.queue.images): encoded once at the producer, sent as msgpack binary,
checked at the worker without decoding, and handed to managers per row, decoded only on demand."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from PIL import Image

from rewardq.consumers.batch import build_batch
from rewardq.errors import RecordError
from rewardq.queue.codec import decode_output, encode_output
from rewardq.queue.images import EncodedImage, Spot, check_image_bytes, encode_multi_modal, images_of
from rewardq.reward.rows import non_tensor
from tests.support.checks import must


def picture(
    size: tuple[int, int] = (8, 6), color: tuple[int, ...] | int = (200, 30, 60), mode: str = "RGB"
) -> Image.Image:
    return Image.new(mode, size, color)


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def jpeg_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG")
    return buf.getvalue()


def output(**extra: Any) -> dict[str, Any]:
    return {"prompt_ids": [1, 2, 3], "response_ids": [4, 5], **extra}


SAMPLE: dict[str, Any] = {"data_source": "hiyouga/geometry3k", "reward_model": {"ground_truth": "3"}}


def test_a_pil_image_is_encoded_once_to_png_and_arrives_byte_for_byte() -> None:
    img = picture()
    data = encode_output("u", "s", 0, output(multi_modal_data={"images": [img]}), SAMPLE, final=True)
    raw = msgpack.unpackb(data, raw=False, ext_hook=lambda c, b: None)
    assert isinstance(raw["multi_modal_data"]["images"][0], bytes)  # msgpack binary, not an extension or pickle
    rec = decode_output(data)
    got = must(rec.multi_modal_data)["images"][0]
    assert isinstance(got, EncodedImage) and got.format == "png"
    assert got.data == png_bytes(img)
    assert got.to_pil().tobytes() == img.tobytes()


def test_encoded_bytes_files_and_data_urls_travel_as_they_are() -> None:
    jpg = jpeg_bytes(picture())
    url = "data:image/jpeg;base64," + base64.b64encode(jpg).decode()
    hf = {"bytes": jpg, "path": None}
    got = encode_multi_modal({"images": [jpg, url, hf, EncodedImage(jpg, "jpeg")]}, output=0)
    assert got == {"images": [jpg] * 4}


def test_a_path_is_read_and_another_format_becomes_png(tmp_path: Path) -> None:
    gif = tmp_path / "x.gif"
    picture().save(gif, format="GIF")
    [data] = must(encode_multi_modal({"image": [str(gif)]}, output=0))["image"]
    assert data.startswith(b"\x89PNG") and Image.open(io.BytesIO(data)).size == (8, 6)
    [data2] = must(encode_multi_modal({"image": [f"file://{gif}"]}, output=0))["image"]
    assert data2 == data
    arr = np.zeros((4, 5, 3), dtype=np.uint8)
    [from_array] = must(encode_multi_modal({"images": [arr]}, output=0))["images"]
    assert Image.open(io.BytesIO(from_array)).size == (5, 4)


def test_an_oversize_image_is_refused_at_the_producer_naming_output_and_image() -> None:
    small, big = png_bytes(picture()), png_bytes(picture(size=(300, 300), color=7, mode="L"))
    outs = [output(), output(multi_modal_data={"images": [small, big]})]
    from rewardq.producers.core import prepare_trajectory
    from rewardq.queue.keys import Keyspace

    with pytest.raises(RecordError) as err:
        prepare_trajectory(Keyspace("t"), "u", "s", outs, SAMPLE, max_bytes=1 << 20, max_image_bytes=len(big) - 1)
    assert err.value.field == "multi_modal_data.images[1]"
    assert f"output 1, image 1 is {len(big)} bytes, more than max_image_bytes={len(big) - 1}" in str(err.value)


def corrupt_png() -> bytes:
    data = bytearray(png_bytes(picture(size=(32, 32))))
    data[len(data) // 2] ^= 0xFF  # inside the pixel data: its chunk checksum no longer matches
    return bytes(data)


@pytest.mark.parametrize(
    "bad,problem",
    [
        (corrupt_png(), "cannot be decoded"),
        (png_bytes(picture())[:-12], "truncated PNG"),
        (b"certainly not an image", "not a PNG, JPEG or WebP image"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "cannot be decoded"),
        ("/no/such/image.png", "cannot read"),
        ("https://example.com/cat.png", "send the image's bytes"),
        (3.5, "is a float"),
    ],
)
def test_an_undecodable_image_is_refused_at_the_producer_by_name(bad: Any, problem: str) -> None:
    with pytest.raises(RecordError) as err:
        encode_output("u", "s", 2, output(multi_modal_data={"images": [png_bytes(picture()), bad]}), SAMPLE, final=True)
    assert err.value.field == "multi_modal_data.images[1]"
    assert "output 2, image 1" in str(err.value) and problem in str(err.value)


def test_videos_travel_as_paths_and_decoded_frames_are_refused() -> None:
    got = encode_multi_modal(
        {"videos": ["/data/v.mp4", ["/f/1.jpg", "/f/2.jpg"], {"video": "file:///v2.mp4"}]}, output=0
    )
    assert got == {"videos": ["/data/v.mp4", ["/f/1.jpg", "/f/2.jpg"], "file:///v2.mp4"]}
    with pytest.raises(RecordError, match="output 0, video 0 is a ndarray; a video travels as the path"):
        encode_multi_modal({"videos": [np.zeros((2, 3, 4, 4))]}, output=0)
    with pytest.raises(RecordError, match="audio is not carried"):
        encode_multi_modal({"audios": [b"x"]}, output=0)


def test_a_text_only_record_keeps_its_bytes() -> None:
    plain = encode_output("u", "s", 0, output(), SAMPLE, final=True)
    assert b"multi_modal_data" not in plain
    assert encode_output("u", "s", 0, output(multi_modal_data={}), SAMPLE, final=True) == plain
    assert decode_output(plain).multi_modal_data is None


def forged(images: list[Any]) -> bytes:
    """A record as a producer that skipped the checks would send it."""
    ok = msgpack.unpackb(encode_output("u", "s", 0, output(), SAMPLE, final=True), raw=False, ext_hook=msgpack.ExtType)
    ok["multi_modal_data"] = {"images": images}
    result: bytes = msgpack.packb(ok, use_bin_type=True)
    return result


@pytest.mark.parametrize(
    "image,problem",
    [
        (b"GIF89a....", "not a PNG, JPEG or WebP image"),
        (None, "must be encoded image bytes"),
        ("a string", "must be encoded image bytes"),
    ],
)
def test_the_worker_refuses_a_forged_image_naming_it(image: bytes | str | None, problem: str) -> None:
    with pytest.raises(RecordError) as err:
        decode_output(forged([image]))
    assert err.value.field == "multi_modal_data.images[0]" and problem in str(err.value)


def test_the_worker_refuses_cut_images_and_oversize_ones_without_decoding() -> None:
    png, jpg = png_bytes(picture()), jpeg_bytes(picture())
    spot = Spot("multi_modal_data.images[0]", 0, 0)
    assert check_image_bytes(png, spot, 1 << 20) == "png"
    assert check_image_bytes(jpg, spot, 1 << 20) == "jpeg"
    for cut in (png[:-12], jpg[: len(jpg) // 2]):
        with pytest.raises(RecordError, match="cut or damaged"):
            decode_output(forged([cut]))
    with pytest.raises(RecordError, match="more than max_image_bytes=10"):
        decode_output(forged([png]), max_image_bytes=10)
    webp = io.BytesIO()
    picture().save(webp, format="WEBP")
    assert check_image_bytes(webp.getvalue(), spot, 1 << 20) == "webp"
    with pytest.raises(RecordError, match="cut or damaged WebP"):
        check_image_bytes(webp.getvalue()[:-3], spot, 1 << 20)


def test_managers_get_each_rows_images_lazily_and_the_samples_column_otherwise() -> None:
    own = picture(color=(1, 2, 3))
    shared = picture(color=(9, 9, 9))
    sample = {**SAMPLE, "multi_modal_data": {"image": [shared]}}
    recs = [
        decode_output(encode_output("u", "s", 0, output(), sample, final=False)),
        decode_output(encode_output("u", "s", 1, output(multi_modal_data={"images": [own]}), sample, final=True)),
    ]
    batch = build_batch(recs)
    first = images_of(non_tensor(batch[0:1], "multi_modal_data"))
    final = images_of(non_tensor(batch[1:2], "multi_modal_data"))
    assert [i.data for i in first] == [png_bytes(shared)]  # no images of its own: the dataset's
    assert [i.data for i in final] == [png_bytes(own)]
    assert final[0]._pil is None  # nothing decoded until a manager asks
    assert final[0].to_pil().getpixel((0, 0)) == (1, 2, 3)
    assert final[0].data_url().startswith("data:image/png;base64,")


def test_a_text_only_batch_has_no_multi_modal_column() -> None:
    batch = build_batch([decode_output(encode_output("u", "s", 0, output(), SAMPLE, final=True))])
    assert "multi_modal_data" not in batch.keys()


def test_an_image_error_names_its_output_once_at_the_producer_and_at_the_worker() -> None:
    big = png_bytes(picture(size=(30, 30), color=7, mode="L"))
    limit = "; send a smaller image (resize it, or JPEG/WebP) or raise max_image_bytes on producers and workers"
    # Given an output (index 1) whose image is over max_image_bytes
    # When the producer encodes it, Then the message names the output once, by its index beside the image
    with pytest.raises(RecordError) as err:
        encode_output("u", "s", 1, output(multi_modal_data={"images": [big]}), SAMPLE, final=True, max_image_bytes=10)
    assert (
        str(err.value)
        == f"multi_modal_data.images[0]: output 1, image 0 is {len(big)} bytes, more than max_image_bytes=10{limit}"
    )
    # And the worker's check of the same image reads the same (its output index is 0 here)
    with pytest.raises(RecordError) as err:
        decode_output(forged([big]), max_image_bytes=10)
    assert (
        str(err.value)
        == f"multi_modal_data.images[0]: output 0, image 0 is {len(big)} bytes, more than max_image_bytes=10{limit}"
    )
    # And an error that does not name its output gets the output's key, once
    with pytest.raises(RecordError) as err:
        encode_output("u", "s", 1, output(multi_modal_data=[big]), SAMPLE, final=True)
    assert str(err.value) == "multi_modal_data: must be a dict like {'images': [...]}, got list (output u_s_1)"
    with pytest.raises(RecordError) as err:
        encode_output("u", "s", 1, output(prompt_ids=[-1]), SAMPLE, final=True)
    assert str(err.value) == "prompt_ids: token id -1 is negative (output u_s_1)"
