"""The figure on the page: a stack of images, the frame shown on top and frames drawn ahead beneath it.

A panel draws ahead the positions one step from the reader's (:mod:`klviz.widgets.ahead`). Sent to
the page only when the reader arrives there, such a frame still has to travel (20-45 kB) and load:
measured in JupyterLab with headless Chromium, the page took 5-10 ms from a frame's arrival to its
``load``, behind the other work it had queued. So each frame drawn ahead is sent at once, while the
kernel idles, to an image beneath the one shown; the page loads and decodes it there, unseen. A
step to that position then only brings that image to the top: a message of a few bytes, and the
page has nothing left to load.

The images share one cell of a CSS grid. Overlapping grid items are painted in "order-modified
document order" (CSS Grid Layout Level 1, "Z-axis Ordering: the z-index property"; the web-platform
test ``css/css-grid/grid-items/grid-order-property-painting-004.html`` checks it), so the image
with the highest ``order`` is seen, with no style sheet needed. Only opaque frames go beneath (see
:meth:`FrameStack.put_beneath`), so nothing under the top image shows through.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable

import ipywidgets as widgets

from .frames import blank_png, png_url

__all__ = ["SETTLE_S", "FrameStack", "blank_url"]

#: seconds a frame sent beneath waits before it may be brought to the top. The page keeps showing an
#: image's previous frame until its new one has loaded (measured above: 5-10 ms, under load more), so
#: one raised sooner could show an older frame for a moment; a step that comes sooner is sent its
#: frame as before
SETTLE_S = 0.03


@functools.lru_cache(maxsize=16)
def blank_url(width_px: int, height_px: int) -> bytes:
    """A fully transparent frame of ``width_px`` x ``height_px`` as a ``data:`` URL (under 1 kB).

    What an image of the stack holds before its first frame: an image with no source is drawn as a
    broken image (an icon and a border) in Chromium, and a placeholder of another aspect would give
    the image, and so the stack, that aspect once it has loaded."""
    return png_url(blank_png(width_px, height_px))


class FrameStack:
    """``slots`` images of ``width_px`` x ``height_px`` CSS pixels stacked in one place; one is seen.

    Each image holds one frame and the key (any object, compared by identity) of the position it
    shows. :meth:`show` puts a new frame in the image on top; :meth:`put_beneath` sends a frame to
    one beneath; :meth:`bring_up` shows a frame already beneath by raising its image.
    """

    def __init__(self, width_px: int, height_px: int, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        # The figure's own size, narrower where the page is (the images keep their aspect: the
        # width and height attributes give it before a frame has loaded, so the page keeps its layout)
        self.images = [
            widgets.Image(
                value=blank_url(width_px, height_px),
                format="url",
                width=str(width_px),
                height=str(height_px),
                layout=widgets.Layout(grid_area="1 / 1", order="0", width="100%", height="auto", margin="0"),
            )
            for _ in range(slots)
        ]
        for image in self.images:
            image.add_class("klviz-frame")
        self.widget = widgets.Box(
            self.images,
            layout=widgets.Layout(display="grid", width=f"{width_px}px", max_width="100%", overflow="hidden"),
        ).add_class("klviz-figure")
        self.top = 0
        self._order = 1
        self.images[0].layout.order = "1"
        self._keys: list[object | None] = [None] * slots
        self._sent_at = [0.0] * slots
        #: steps answered by raising an image (for tests and the benchmark)
        self.raised = 0

    @property
    def shown(self) -> widgets.Image:
        """The image on top, the one the reader sees."""
        return self.images[self.top]

    def show(self, url: bytes, key: object | None = None) -> None:
        """Send the frame ``url`` (a ``data:`` URL) to the image on top; ``key``: the position it shows."""
        self.shown.value = url
        self._keys[self.top] = key
        self._sent_at[self.top] = time.perf_counter()

    def label(self, key: object | None) -> None:
        """Mark the frame on top as showing position ``key`` (a step back to it can then raise it)."""
        self._keys[self.top] = key

    def holds(self, key: object) -> bool:
        """Whether an image holds the frame of position ``key``."""
        return any(k is key for k in self._keys)

    def put_beneath(self, url: bytes, key: object, keep: Iterable[object], *, opaque: bool = False) -> bool:
        """Send the frame ``url`` of position ``key`` to an image beneath the top; False if it is not sent.

        The image chosen holds no position in ``keep`` (those still wanted), else the oldest frame.
        Only frames that are ``opaque`` (every pixel's alpha 255) go beneath: an image on top with
        transparent parts would let the frames beneath show through.
        """
        if len(self.images) < 2 or self.holds(key) or not opaque:
            return False
        kept = list(keep)
        beneath = [i for i in range(len(self.images)) if i != self.top]
        free = [i for i in beneath if not any(self._keys[i] is k for k in kept)] or beneath
        slot = min(free, key=lambda i: self._sent_at[i])
        self.images[slot].value = url
        self._keys[slot], self._sent_at[slot] = key, time.perf_counter()
        return True

    def bring_up(self, key: object) -> bool:
        """Show the frame of position ``key`` if an image holds it and has had :data:`SETTLE_S` to
        load; True if it is shown now (nothing is sent when it is on top already)."""
        if self._keys[self.top] is key:
            return True
        now = time.perf_counter()
        for slot, held in enumerate(self._keys):
            if held is key and now - self._sent_at[slot] >= SETTLE_S:
                self._order += 1
                self.images[slot].layout.order = str(self._order)
                self.top = slot
                self.raised += 1
                return True
        return False
