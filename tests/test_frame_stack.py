"""FrameStack (klviz.widgets.stack): which image is seen, and which one a frame drawn ahead goes to."""

from __future__ import annotations

import pytest

from klviz.widgets import stack
from klviz.widgets.frames import blank_png
from klviz.widgets.stack import FrameStack

WEBP = b"data:image/webp;base64,AAAA"


def seen(frames: FrameStack) -> int:
    """The image the page paints on top: the highest ``order`` (the last of equals, in page order)."""
    orders = [int(image.layout.order) for image in frames.images]
    return max(range(len(orders)), key=lambda i: (orders[i], i))


def test_the_image_on_top_is_the_one_seen_and_raising_changes_only_its_order(monkeypatch):
    monkeypatch.setattr(stack, "SETTLE_S", 0.0)
    frames = FrameStack(100, 50, slots=3)
    assert seen(frames) == frames.top == 0
    assert frames.widget.layout.display == "grid" and frames.widget.layout.width == "100px"
    assert all((image.width, image.height) == ("100", "50") for image in frames.images)
    assert all(image.layout.grid_area == "1 / 1" for image in frames.images)  # one cell: overlapping
    a, b, c = object(), object(), object()
    frames.show(WEBP + b"A", a)
    assert frames.put_beneath(WEBP + b"B", b, keep=[a, b], opaque=True)
    assert frames.put_beneath(WEBP + b"C", c, keep=[a, b, c], opaque=True)
    assert frames.shown.value == WEBP + b"A"  # frames beneath do not change what is seen
    for key, url in ((b, b"B"), (c, b"C"), (a, b"A"), (c, b"C")):
        others = {id(i): i.layout.order for i in frames.images if bytes(i.value) != WEBP + url}
        assert frames.bring_up(key)
        assert seen(frames) == frames.top and frames.shown.value == WEBP + url
        assert {id(i): i.layout.order for i in frames.images if id(i) in others} == others
    assert frames.raised == 4
    assert frames.bring_up(c) and frames.raised == 4  # on top already: nothing sent


def test_a_frame_goes_beneath_to_an_image_no_kept_position_holds():
    frames = FrameStack(10, 10, slots=3)
    a, b, c, d = object(), object(), object(), object()
    frames.show(WEBP + b"A", a)
    frames.put_beneath(WEBP + b"B", b, keep=[a, b], opaque=True)
    frames.put_beneath(WEBP + b"C", c, keep=[a, b, c], opaque=True)
    # b is no longer wanted, c is: d replaces b, never the top (a) or c
    assert frames.put_beneath(WEBP + b"D", d, keep=[a, c, d], opaque=True)
    assert sorted(bytes(i.value) for i in frames.images) == sorted([WEBP + b"A", WEBP + b"C", WEBP + b"D"])
    assert frames.shown.value == WEBP + b"A"
    assert not frames.put_beneath(WEBP + b"D", d, keep=[a, c, d], opaque=True)  # already there: not sent again
    assert frames.holds(d) and not frames.holds(b)


def test_only_opaque_frames_go_beneath_and_one_image_holds_none():
    frames = FrameStack(10, 10, slots=3)
    assert not frames.put_beneath(b"data:image/png;base64,AAAA", object(), keep=[])  # not known to be opaque
    assert frames.put_beneath(b"data:image/png;base64,AAAA", object(), keep=[], opaque=True)
    single = FrameStack(10, 10, slots=1)
    assert not single.put_beneath(WEBP, object(), keep=[], opaque=True)
    assert not single.bring_up(object())
    with pytest.raises(ValueError, match="slots"):
        FrameStack(10, 10, slots=0)


def test_a_frame_is_raised_only_once_it_has_had_time_to_load(monkeypatch):
    monkeypatch.setattr(stack, "SETTLE_S", 3600.0)
    frames = FrameStack(10, 10, slots=2)
    key = object()
    frames.put_beneath(WEBP, key, keep=[key], opaque=True)
    assert not frames.bring_up(key) and frames.top == 0
    monkeypatch.setattr(stack, "SETTLE_S", 0.0)
    assert frames.bring_up(key) and frames.top == 1


def test_an_image_before_its_first_frame_is_transparent_at_the_figure_s_aspect():
    """No source would draw a broken image; a placeholder of another aspect would resize the stack."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    frames = FrameStack(960, 340, slots=3)
    for image in frames.images:
        head, _, body = bytes(image.value).partition(b",")
        assert head == b"data:image/png;base64" and len(body) < 1400
        blank = Image.open(io.BytesIO(base64.b64decode(body)))
        assert blank.size == (960, 340)
        assert not np.asarray(blank.convert("RGBA"))[..., 3].any()  # every pixel fully transparent
    with pytest.raises(ValueError, match="width and height"):
        blank_png(0, 10)
