"""The one size every image of a set shares, for a loader given no transforms that fix one.

A set such as MS1M (every face 112x112) needs no resize: the loader takes the size of the
set's first image as every image's, after a look at a few more spread over the set, so a set
of mixed sizes is refused at once, naming two of its sizes. Every image is still checked in
the worker (``Pipeline.input_from``): one of another size is a ``SpecError`` naming its key
and both sizes, raised or skipped as ``on_error`` says.

When the transforms do fix the size, the first image's size is still read from its header
and the chain is checked on it (:func:`check_first_image`): a ``RandomCrop(300)`` over a set
of 112-px images is refused at construction, not at the first batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stoker._core.errors import ImageDecodeError, SpecError, StokerFormatError
from stoker._core.seeding import sample_rng
from stoker._core.specs import ArraySpec
from stoker.codecs import decode
from stoker.formats import Reader
from stoker.formats.base import is_encoded
from stoker.pipeline import leaves_size_open, size_lost

__all__ = ["PROBES", "check_first_image", "input_spec", "learned_output", "shared_image_spec"]

#: images whose size is read at construction: the first and others spread over the set
PROBES = 8
#: what a sample that cannot be read raises: left to the worker while others can be read (a
#: folder's file that is gone or unreadable is one sample's fault; storage errors are not)
BAD_SAMPLE = (StokerFormatError, ImageDecodeError, FileNotFoundError, PermissionError)


def probe_positions(source: Any, probes: int) -> list[int] | None:
    """Where to read ``probes`` images cheaply: a remote set's first shard (its
    ``remote().probe_positions``), else ``None`` (a spread over the set)."""
    remote = source.remote()
    return None if remote is None else remote.probe_positions(probes)


def _size(source: Reader, i: int) -> tuple[int, int]:
    """(height, width) of sample ``i`` from its image header (the size decoding gives: the
    decoders ignore EXIF orientation), or a decoded image's shape."""
    payload, _label = source.read(i)
    return source.size_of(i, payload)


def shared_image_spec(
    source: Reader, *, probes: int = PROBES, skip: bool = False
) -> tuple[ArraySpec, str]:
    """``((h, w, C) dtype, where)``: the decoded shape of the set's first readable image and
    a description of that image, for ``Pipeline(input_from=where)``.

    The sizes of up to ``probes`` images spread over the set are read from their headers; two
    that differ are a :class:`SpecError` naming both (the set needs a Resize or RandomCrop),
    unless ``skip`` (the loader's ``on_error="skip"``): then the commonest size is taken (the
    first seen on a tie) and the worker drops the images of other sizes, as many as
    ``max_bad_fraction`` allows. A sample that cannot be read (a corrupt record, an image
    whose header does not decode) is passed over here (the worker reports it as ``on_error``
    says); when none can be read, the first one's error is raised as it is. Any other error
    (a full shard cache, a storage failure) is raised at once, as itself."""
    n = len(source)
    positions = probe_positions(source, probes)  # a remote set: where nothing is fetched
    if positions is None:
        positions = np.unique(np.linspace(0, n - 1, num=min(n, probes)).astype(np.int64)).tolist()
    seen: dict[tuple[int, int], list[int]] = {}  # size -> positions, in the order first seen
    failure: Exception | None = None
    for i in positions:
        try:
            hw = _size(source, i)
        except BAD_SAMPLE as e:  # the worker's to report, as on_error says
            failure = failure or e
            continue
        seen.setdefault(hw, []).append(i)
        if len(seen) > 1 and not skip:
            (a, (h0, w0)), (b, (h1, w1)) = [(at[0], size) for size, at in seen.items()]
            raise SpecError(
                f"the images differ in size ({source.describe(a)} is {h0}x{w0}, "
                f"{source.describe(b)} is {h1}x{w1}) and no transforms fix one: add a Resize "
                "or RandomCrop so that every sample has one shape"
            )
    if not seen:
        assert failure is not None
        raise failure
    (h, w), at = max(seen.items(), key=lambda kv: len(kv[1]))  # the first on a tie
    i = at[0]
    open_spec = source.sample_spec
    spec = ArraySpec((h, w, *open_spec.shape[2:]), open_spec.dtype)
    if i == 0:
        what = "the set's first image"
    elif len(seen) > 1:
        what = f"the commonest of the sizes of {len(positions)} images spread over the set"
    else:
        what = "the first image whose size could be read"
    return spec, f"{source.describe(i)}, {what}"


def learned_output(
    source: Reader, spec: ArraySpec, transforms: Any, variable_width: bool, variable_height: bool
) -> ArraySpec | None:
    """The sample ``transforms`` make of the set's first image when they leave the batch's
    size open only because a plain function (``as_transform(f)`` without ``output=``) does
    not say its size; the loader checks every sample against it. ``None`` when the chain
    needs no such look, or that image does not read (the pipeline then names the open size)."""
    wide = {"variable_width": variable_width, "variable_height": variable_height}
    if not leaves_size_open(spec, transforms, **wide) or leaves_size_open(
        spec, transforms, learnt=True, **wide
    ):
        return None
    i = (probe_positions(source, 1) or [0])[0]
    try:
        image, _label = source.read(i)
        img = decode(image) if is_encoded(source.encoded, image) else np.asarray(image)
    except BAD_SAMPLE:
        return None
    out = transforms(img, sample_rng(0, 0, i))
    return ArraySpec(out.shape, out.dtype.name) if isinstance(out, np.ndarray) else None


def input_spec(
    source: Reader,
    transforms: Any,
    variable_width: bool,
    variable_height: bool,
    on_error: str = "raise",
) -> tuple[ArraySpec, str]:
    """``(spec, where)`` for the loader's pipeline: the source's ``sample_spec`` (``where``
    empty), or, when that leaves the chain's size open and the source stores encoded images
    of open size, the one size its images share (:func:`shared_image_spec`, which under
    ``on_error="skip"`` takes the commonest size it sees)."""
    spec = source.sample_spec
    if source.encoded is False or spec.fixed or len(spec.shape) != 3 or spec.shape[2] is None:
        return spec, ""
    open_size = leaves_size_open(
        spec,
        transforms,
        variable_width=variable_width,
        variable_height=variable_height,
        learnt=True,
    )
    if not open_size:
        if on_error != "skip":
            check_first_image(source, transforms)
        return spec, ""
    lost = size_lost(transforms, spec)
    if lost:
        raise SpecError(f"transforms: {lost[:-1]}")
    return shared_image_spec(source, skip=on_error == "skip")


def check_first_image(source: Reader, transforms: Any) -> None:
    """:class:`SpecError` naming the set's first image when ``transforms`` cannot take its
    size (a crop larger than the image, with no Resize before it): the error the first batch
    would raise, at construction. The size comes from the image's header (a remote set's:
    where :func:`shared_image_spec` reads it); an image whose header cannot be read is left to
    the worker, which reports it as ``on_error`` says."""
    if transforms is None or len(source) == 0:
        return
    positions = probe_positions(source, 1)
    i = positions[0] if positions else 0
    try:
        h, w = _size(source, i)
    except BAD_SAMPLE:  # the worker's to report
        return
    open_spec = source.sample_spec
    try:
        transforms.output_spec(ArraySpec((h, w, *open_spec.shape[2:]), open_spec.dtype))
    except SpecError as e:
        raise SpecError(f"{source.describe(i)} is {h}x{w}: {e}") from None
