"""Chains run as one op: less work per image than running their steps one after another.

:func:`fuse` recognises the head of a classification chain a :class:`~stoker.pipeline.Pipeline`
can run in fewer passes, and returns a :class:`FusedCrop` that gives the same pixels after
the same draws from ``rng``:

- ``Resize`` (bilinear) then ``RandomCrop`` (no padding) or ``CenterCrop``: only the window
  of the image the crop keeps is resized (:func:`window_resize`), on the very sampling grid of
  the whole resize, so the crop's pixels come out the same;
- ``RandomResizedCrop``, which already resizes only its box;
- a crop alone;
- each optionally followed by ``HorizontalFlip``, which is then folded into the write into
  the batch row (``cv2.flip`` straight into it) instead of making a mirrored copy that is
  copied again.

The user writes the plain chain; the pipeline chooses the fused op. Boxes, points and masks
never take this path: a sample carrying them runs the chain's ``apply_targets``.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from stoker.transforms._geom import resize
from stoker.transforms._util import check_image, cv2, cv_input, restore_channels, scratch
from stoker.transforms.geometry import (
    CenterCrop,
    HorizontalFlip,
    RandomCrop,
    RandomResizedCrop,
    Resize,
)

__all__ = ["FusedCrop", "RowWriter", "fuse", "mirror", "window_resize", "write_chw", "write_head"]

if TYPE_CHECKING:
    from stoker.transforms.color import Normalize

# A window is resized only when it saves at least this share of the whole resize's pixels
# (below that the extra slicing costs about what the smaller resize saves).
MIN_SAVING = 0.05
# What a row writer keeps per thread (see _WriterState).
MAX_PLANS = 4096
MAX_BUFFERS = 8


@functools.lru_cache(maxsize=4096)  # a set of one image size asks the same few questions
def _axis_window(n: int, m: int, off: int, k: int) -> tuple[int, int, int, int] | None:
    """On one axis, a resize of ``n`` source pixels to ``m`` whose output ``[off, off + k)`` is
    kept: ``(src_start, src_len, out_len, skip)`` such that resizing source
    ``[src_start, src_start + src_len)`` to ``out_len`` pixels and skipping ``skip`` of them
    gives output ``[off, off + k)`` on the same sampling grid, or ``None`` when no such window
    is smaller than the whole axis.

    cv2's bilinear resize samples output ``j`` at source ``(j + 0.5) * n / m - 0.5``. The grid
    repeats every ``q = m / gcd(n, m)`` output pixels (``p = n / gcd`` source pixels), so a
    window starting at a multiple of ``p`` and ``c * p`` pixels long, resized to ``c * q``,
    has the same ratio and the same sample positions, shifted by a whole number of pixels.
    Its own clamping at its edges must not touch a kept pixel: both taps of every kept sample
    lie inside it, unless the window's edge is the image's."""
    g = math.gcd(n, m)
    p, q = n // g, m // g
    first = (off + 0.5) * n / m - 0.5  # source position of the first kept sample
    last = (off + k - 0.5) * n / m - 0.5
    a = off // q  # periods before the window
    if a > 0 and math.floor(first) < a * p:  # its left tap would be clamped: one period more
        a -= 1
    need = math.floor(last) + 2  # source pixels the window must reach (right tap included)
    periods = max(-(-(off + k - a * q) // q), -(-(need - a * p) // p))
    periods = min(periods, g - a)  # at most to the image's edge (clamped there as the whole)
    if periods * q > m * (1.0 - MIN_SAVING):
        return None
    return a * p, periods * p, periods * q, off - a * q


Plan = tuple[slice, slice, tuple[int, int], slice, slice]


@functools.lru_cache(maxsize=4096)  # a set of one image size asks the same few questions
def _window_plan(sh: int, sw: int, rh: int, rw: int, top: int, left: int, ch: int, cw: int) -> Plan:
    """How to get ``cv2.resize`` of an ``sh`` x ``sw`` image to ``rh`` x ``rw``, cropped at
    ``(top, left)`` to ``ch`` x ``cw``, by resizing as little as the sampling grid allows
    (:func:`_axis_window` per axis, the whole axis where no window is smaller): ``(rows,
    columns)`` of the source to resize, the ``(width, height)`` to resize them to, and the
    ``(rows, columns)`` of that result that are the crop."""
    y0, ny, oy, ky = _axis_window(sh, rh, top, ch) or (0, sh, rh, top)
    x0, nx, ox, kx = _axis_window(sw, rw, left, cw) or (0, sw, rw, left)
    return (
        slice(y0, y0 + ny),
        slice(x0, x0 + nx),
        (ox, oy),
        slice(ky, ky + ch),
        slice(kx, kx + cw),
    )


def window_resize(
    img: np.ndarray,
    out_hw: tuple[int, int],
    top: int,
    left: int,
    crop_hw: tuple[int, int],
) -> np.ndarray:
    """``cv2.resize(img, out_hw, INTER_LINEAR)[top : top + h, left : left + w]``, resizing only
    a window of ``img`` that covers the crop when one is smaller than the whole image (see
    :func:`_window_plan`). Returns a view of a new array."""
    ys, xs, size, kys, kxs = _window_plan(*img.shape[:2], *out_hw, top, left, *crop_hw)
    c = cv2()  # resize()'s own checks cost a microsecond, 4 % of a 112-pixel window
    out = c.resize(cv_input(img[ys, xs]), size, interpolation=c.INTER_LINEAR)
    return restore_channels(out, img)[kys, kxs]


def _flip_buffer(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A reused array of ``shape`` to mirror into (one per thread, shape and dtype)."""
    return scratch("flip", (shape, dtype.str), np.empty, shape, dtype)


def mirror(img: np.ndarray, dest: np.ndarray | None = None) -> np.ndarray:
    """``img`` mirrored left-right into ``dest`` (contiguous, ``img``'s shape), or into a
    reused scratch array when ``dest`` is ``None``: the caller must be done with it before the
    next call on this thread."""
    if dest is None:
        dest = _flip_buffer(img.shape, img.dtype)
    out = cv2().flip(cv_input(img), 1, dst=dest)
    if out is not dest:  # cv2 made its own array (an HxWx1 image comes back HxW)
        np.copyto(dest, restore_channels(out, img), casting="no")
    return dest


def write_chw(img: np.ndarray, dest: np.ndarray, *, flip: bool = False) -> None:
    """``img`` (H, W, C) into ``dest`` (C, H, W), mirrored left-right when ``flip``: one copy
    (or ``cv2.flip``) into a reused scratch image, then ``cv2.split`` straight into ``dest``'s
    planes (a contiguous, unmirrored ``img`` is split as it is). The same values as
    ``np.copyto(dest, img[:, ::-1].transpose(2, 0, 1))``, at a third of its cost (numpy's
    transposing copy walks the source three bytes apart)."""
    c = img.shape[2]
    if c > 4 or dest.dtype != img.dtype or not dest.flags.c_contiguous:
        np.copyto(dest, (img[:, ::-1] if flip else img).transpose(2, 0, 1), casting="no")
        return
    _split_planes(img, dest, flip, _flip_buffer(img.shape, img.dtype))


def _split_planes(img: np.ndarray, dest: np.ndarray, flip: bool, scratch: np.ndarray) -> None:
    """:func:`write_chw` once its checks hold (``dest`` C-contiguous, of ``img``'s dtype, at
    most 4 channels), with ``scratch`` (``img``'s shape and dtype) to mirror or copy into: a
    contiguous, unmirrored ``img`` is split as it is; a view of a crop is copied first, since
    ``cv2.split`` walks it pixel by pixel at 10x the cost of the copy."""
    if flip:
        src = mirror(img, scratch)
    elif img.flags.c_contiguous:
        src = img
    else:
        src = scratch
        np.copyto(src, img, casting="no")
    c = img.shape[2]
    planes = [dest[0], dest[1], dest[2]] if c == 3 else [dest[k] for k in range(c)]
    got = cv2().split(src, planes)
    if got[0] is not planes[0]:  # OpenCV made arrays of its own: copy them over
        for k in range(c):
            np.copyto(dest[k], got[k], casting="no")


def write_head(
    head: np.ndarray, dest: np.ndarray, *, flip: bool, chw: bool, tail: Normalize | None
) -> None:
    """A fused head's output (HWC; mirrored when ``flip``) into batch row ``dest``: through
    ``tail`` (a trailing ``Normalize``) when given, else as it is in HWC or through
    :func:`write_chw`."""
    if tail is not None:
        tail.write(mirror(head) if flip else head, dest, chw=chw)
    elif chw:
        write_chw(head, dest, flip=flip)
    elif flip:
        mirror(head, dest)
    else:
        np.copyto(dest, head, casting="no")


# a row writer's window plan: source rows and columns, resize to (w, h), the buffer resized
# into, the crop's view of it, and the crop's rows and columns of the resized window
_HeadPlan = tuple[slice, slice, tuple[int, int], np.ndarray, np.ndarray, slice, slice]


class RowWriter(Protocol):
    """What :meth:`FusedCrop.row_writer` returns (see there)."""

    def __call__(
        self,
        img: np.ndarray,
        rng: np.random.Generator | None,
        dest: np.ndarray,
        first: Sequence[float] | None = None,
    ) -> bool: ...


class _WriterState(threading.local):
    """A row writer's memo, one per thread: each crop position's window plan with the buffer
    it resizes into and the crop's view of that buffer (made once, not per sample), each
    input size's resize target, and an image of the ``head`` shape to mirror or copy into.
    Bounded: at most :data:`MAX_BUFFERS` buffer shapes (a ninth drops every plan, which view
    them) and 4,096 plans or targets."""

    def __init__(self, head: tuple[int, int, int]) -> None:
        self.plans: dict[tuple[int, int, int, int], _HeadPlan] = {}
        self.targets: dict[tuple[int, int], tuple[int, int]] = {}
        self.buffers: dict[tuple[int, ...], np.ndarray] = {}
        self.scratch = np.empty(head, np.uint8)

    def target(self, rs: Resize, sh: int, sw: int) -> tuple[int, int]:
        got = self.targets.get((sh, sw))
        if got is None:
            if len(self.targets) >= MAX_PLANS:
                self.targets.clear()
            got = self.targets[(sh, sw)] = rs.target((sh, sw))
        return got

    def buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        """A uint8 buffer to resize into, made on first use; plans view them, so dropping them
        drops the plans."""
        buf = self.buffers.get(shape)
        if buf is None:
            if len(self.buffers) >= MAX_BUFFERS:
                self.buffers.clear()
                self.plans.clear()
            buf = self.buffers[shape] = np.empty(shape, np.uint8)
        return buf

    def keep(self, key: tuple[int, int, int, int], plan: _HeadPlan) -> _HeadPlan:
        if len(self.plans) >= MAX_PLANS:
            self.plans.clear()
        self.plans[key] = plan
        return plan


@dataclass(frozen=True)
class FusedCrop:
    """``resize`` (or none) then ``crop``, then ``flip`` (or none), run as one op:
    :meth:`crop_and_flip` gives the unmirrored crop and whether to mirror it, after exactly the
    draws of the plain chain (the crop's, then the flip's)."""

    crop: RandomCrop | CenterCrop | RandomResizedCrop
    resize: Resize | None = None
    flip: HorizontalFlip | None = None

    def crop_and_flip(self, img: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
        """(the chain's output before the flip, whether the flip mirrors it)."""
        check_image(img, "FusedCrop")
        crop = self.crop
        if isinstance(crop, RandomResizedCrop):
            out = crop(img, rng)
        else:
            hw = img.shape[:2]
            rs = self.resize
            if rs is not None:
                hw = rs.target(hw)
            if isinstance(crop, CenterCrop):
                top, left = crop.params(hw)
            else:
                top, left = crop.params(hw, rng)
            size: tuple[int, int] = crop.size  # type: ignore[assignment]
            if rs is None or hw == img.shape[:2]:
                out = img[top : top + size[0], left : left + size[1]]
            else:
                out = window_resize(img, hw, top, left, size)
        return out, (self.flip is not None and self.flip.params(rng))

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The chain's output (a contiguous array when mirrored, else possibly a view)."""
        out, flip = self.crop_and_flip(img, rng)
        return mirror(out, np.empty(out.shape, out.dtype)) if flip else out

    @property
    def draws_first_block(self) -> bool:
        """Whether every draw of :meth:`crop_and_flip` comes from the first four doubles of
        the generator's stream (a random or centre crop and a flip, not a random resized
        crop): a row writer then takes them as ``first`` in place of ``rng``."""
        return type(self.crop) is not RandomResizedCrop

    def row_writer(self, *, chw: bool, tail: Normalize | None, channels: int) -> RowWriter:
        """``f(img, rng, dest, first=None)`` for a loader's hot loop: the chain's output for
        ``img`` written straight into batch row ``dest`` (through ``tail`` when given),
        ``True`` when done. ``False``, before any draw from ``rng``, for what is not the
        common case (not a uint8 HWC image of ``channels`` channels, 3 or 4; smaller than the
        crop; a ``dest`` of another shape): the caller then runs the step-by-step path with
        the same generator, which names what is wrong. The same draws and pixels as
        :meth:`crop_and_flip` followed by the write; the window per crop position is worked
        out once (:func:`_window_plan`) and the resize writes into a reused buffer, so a
        sample costs the pixel work and a few microseconds.

        ``first``, when given, is what ``rng.random(4)`` would give (the first block of the
        sample's stream, :meth:`stoker._core.seeding.SampleRngs.first_blocks`): with
        :attr:`draws_first_block` the draws come from it and ``rng`` may be ``None``, which
        saves re-keying a generator per sample. Without it, or for a crop that draws more,
        ``rng=None`` gives ``False``."""
        crop, rs, flip_op = self.crop, self.resize, self.flip
        ch, cw = crop.size  # type: ignore[misc]
        row_shape = (channels, ch, cw) if chw else (ch, cw, channels)
        if type(crop) is RandomResizedCrop:
            return self._box_writer(crop, row_shape, chw=chw, tail=tail)
        c = cv2()
        cv_resize, linear = c.resize, c.INTER_LINEAR
        center = crop if type(crop) is CenterCrop else None
        uint8 = np.dtype(np.uint8)
        flip_p = 0.0 if flip_op is None else float(flip_op.p)
        flip_draws = 0.0 < flip_p < 1.0  # HorizontalFlip.params draws only then
        # _split_planes straight from the head: a CHW uint8 row, no Normalize after the head
        planar = chw and tail is None
        # a float32 CHW row through a trailing Normalize: its split and per-plane pass, set up
        # once (Normalize.planes_writer) instead of through write_head per sample
        planes_into = tail.planes_writer(channels) if chw and tail is not None else None
        f32 = np.dtype(np.float32)
        local = _WriterState((ch, cw, channels))  # per thread: plans and the buffers they view

        def plan(sh: int, sw: int, rh: int, rw: int, top: int, left: int) -> _HeadPlan:
            ys, xs, size, kys, kxs = _window_plan(sh, sw, rh, rw, top, left, ch, cw)
            buf = local.buffer((size[1], size[0], channels))
            head = buf[kys, kxs]
            return local.keep((sh, sw, top, left), (ys, xs, size, buf, head, kys, kxs))

        def write(
            img: np.ndarray,
            rng: np.random.Generator | None,
            dest: np.ndarray,
            first: Sequence[float] | None = None,
        ) -> bool:
            shape = img.shape
            if img.dtype != uint8 or len(shape) != 3 or shape[2] != channels:
                return False
            if tail is None and (dest.shape != row_shape or dest.dtype != uint8):
                return False
            sh, sw = shape[0], shape[1]
            rh, rw = (sh, sw) if rs is None else local.target(rs, sh, sw)
            if rh < ch or rw < cw:
                return False
            if first is None:
                if rng is None:
                    return False
                draws = rng.random
            if center is not None:
                top, left = center.params((rh, rw))
                # HorizontalFlip.params: one draw, for 0 < p < 1 only
                u2 = (draws() if first is None else first[0]) if flip_draws else 1.0
            else:
                # RandomCrop.params (unpadded), then the flip's draw, from one call:
                # random(3) gives what random(2) then random() give
                if first is not None:
                    u0, u1, u2 = first[0], first[1], first[2]
                elif flip_draws:
                    u0, u1, u2 = draws(3).tolist()
                else:
                    (u0, u1), u2 = draws(2).tolist(), 1.0
                top, left = int(u0 * (rh - ch + 1)), int(u1 * (rw - cw + 1))
            flip = u2 < flip_p if flip_draws else flip_p >= 1.0
            if rh == sh and rw == sw:  # no resize: the crop is a view of the image
                head = img[top : top + ch, left : left + cw]
            else:  # window_resize into the plan's buffer, of which head is the crop's view
                ys, xs, size, buf, head, kys, kxs = local.plans.get((sh, sw, top, left)) or plan(
                    sh, sw, rh, rw, top, left
                )
                out = cv_resize(img[ys, xs], size, dst=buf, interpolation=linear)
                if out is not buf:  # OpenCV made an array of its own: crop that one
                    head = out[kys, kxs]
            if planar and dest.flags.c_contiguous:
                _split_planes(head, dest, flip, local.scratch)
            elif (
                planes_into is not None
                and dest.dtype == f32
                and dest.shape == row_shape
                and dest.flags.c_contiguous
            ):
                planes_into(mirror(head, local.scratch) if flip else head, dest)
            else:
                write_head(head, dest, flip=flip, chw=chw, tail=tail)
            return True

        return write

    def _box_writer(
        self, crop: RandomResizedCrop, row_shape: tuple, *, chw: bool, tail: Normalize | None
    ) -> RowWriter:
        """:meth:`row_writer` of a random resized crop: its box, drawn from ``rng`` (``None``
        gives ``False``), resized per sample, then the flip's draw and the write."""
        ch, cw = crop.size  # type: ignore[misc]
        channels, flip_op, uint8 = row_shape[0 if chw else 2], self.flip, np.dtype(np.uint8)

        def write(
            img: np.ndarray,
            rng: np.random.Generator | None,
            dest: np.ndarray,
            first: Sequence[float] | None = None,
        ) -> bool:
            shape = img.shape
            if img.dtype != uint8 or len(shape) != 3 or shape[2] != channels:
                return False
            if tail is None and (dest.shape != row_shape or dest.dtype != uint8) or rng is None:
                return False
            top, left, h, w = crop.params((shape[0], shape[1]), rng)
            head = resize(img[top : top + h, left : left + w], ch, cw, crop.interpolation)
            flip = flip_op is not None and flip_op.params(rng)
            write_head(head, dest, flip=flip, chw=chw, tail=tail)
            return True

        return write


def fuse(steps: Sequence[Any]) -> tuple[FusedCrop, int] | None:
    """``(fused op, number of leading steps it replaces)`` when ``steps`` start with a chain
    :class:`FusedCrop` runs, else ``None``. Only the built-in ops with the settings it
    reproduces exactly are taken: a bilinear ``Resize``, a ``RandomCrop`` without padding."""
    i = 0
    resize_op = None
    if i < len(steps) and type(steps[i]) is Resize:
        if steps[i].interpolation != "bilinear":
            return None
        resize_op, i = steps[i], i + 1
    if i >= len(steps):
        return None
    crop = steps[i]
    if type(crop) is RandomCrop:
        if crop.padding:
            return None
    elif type(crop) is RandomResizedCrop:
        if resize_op is not None:
            return None
    elif type(crop) is not CenterCrop:
        return None
    i += 1
    flip = None
    if i < len(steps) and type(steps[i]) is HorizontalFlip:
        flip, i = steps[i], i + 1
    return FusedCrop(crop, resize_op, flip), i
