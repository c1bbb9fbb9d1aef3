"""The image conversion the prefetcher runs on the device: layout to NCHW, the float cast,
``(x / scale - mean) / std`` in the convention of :class:`stoker.transforms.Normalize`, the
optional flip and erase, the output dtype and memory format."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from stoker.torch.augment import random_erase, random_flip

__all__ = ["LAYOUTS", "check_units", "convert_images", "resolve_scale"]

LAYOUTS = ("auto", "NHWC", "NCHW", "NHW")


def _resolve_layout(x: torch.Tensor, layout: str) -> str:
    if layout != "auto":
        want = {"NHWC": 4, "NCHW": 4, "NHW": 3}[layout]
        if x.ndim != want:
            raise ValueError(f"images declared {layout} but have shape {tuple(x.shape)}")
        return layout
    if x.ndim == 3:
        return "NHW"
    if x.ndim == 4:
        return "NHWC" if x.shape[-1] in (1, 3, 4) else "NCHW"
    raise ValueError(
        f"images must be a batch shaped (N, H, W, C), (N, C, H, W) or (N, H, W); got shape "
        f"{tuple(x.shape)}"
    )


def resolve_scale(scale: float | None, x_dtype: torch.dtype) -> float:
    """``scale`` when given, else 255 for integer images and 1 for float ones."""
    if scale is not None:
        return float(scale)
    return 1.0 if x_dtype.is_floating_point else 255.0


def check_units(
    mean: Sequence[float] | float | None, std: Sequence[float] | float | None, scale: float | None
) -> None:
    """Refuse statistics in pixel units where 0-1 units are meant: ``mean=127.5`` with the
    default scale would normalise every image to about -1 without a word."""
    if mean is None or scale is not None:
        return
    vals = [mean] if isinstance(mean, (int, float)) else list(mean)
    svals = [std] if isinstance(std, (int, float)) else list(std or [])
    if any(abs(float(v)) > 1.0 for v in [*vals, *svals]):
        raise ValueError(
            f"mean={mean!r}, std={std!r} look like pixel units; stoker takes them in 0-1 units, as "
            "transforms.Normalize and torchvision do: (x / scale - mean) / std with scale=255 "
            "for uint8 images (ImageNet: mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)). "
            "Divide them by 255, or pass scale=1 to give them in the images' own units"
        )


def convert_images(
    x: torch.Tensor,
    *,
    mean: float | Sequence[float] | torch.Tensor | None = None,
    std: float | Sequence[float] | torch.Tensor | None = None,
    scale: float | None = None,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
    layout: str = "auto",
    flip_p: float = 0.0,
    erase_p: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The image conversion the prefetcher runs on the device, exposed for reference and tests.

    ``x`` is a batch (N, H, W, C), (N, C, H, W) or (N, H, W) of any dtype on any device; the
    result is a new NCHW tensor of ``dtype``: ``(float32(x) / scale - mean) / std``, the
    convention of :class:`stoker.transforms.Normalize` (``mean``/``std`` in 0-1 units, one
    value or one per channel; ``scale`` 255 for integer images and 1 for float ones unless
    given), then the optional flip and erase, then the cast and memory format.
    """
    px_mean = px_std = None
    if mean is not None and std is not None:
        check_units(
            None if isinstance(mean, torch.Tensor) else mean,
            None if isinstance(std, torch.Tensor) else std,
            scale,
        )
        k = resolve_scale(scale, x.dtype)
        px_mean = channel_tensor(mean, "mean", x.device, k)
        px_std = channel_tensor(std, "std", x.device, k)
    return convert_px(
        x,
        px_mean,
        px_std,
        dtype=dtype,
        channels_last=channels_last,
        layout=layout,
        flip_p=flip_p,
        erase_p=erase_p,
        generator=generator,
    )


def convert_px(
    x: torch.Tensor,
    mean: torch.Tensor | None,
    std: torch.Tensor | None,
    *,
    dtype: torch.dtype,
    channels_last: bool,
    layout: str,
    flip_p: float,
    erase_p: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """:func:`convert_images` with ``mean``/``std`` already in the input's units, shaped
    (1, C, 1, 1) float32 on ``x``'s device (the prefetcher scales them once, not per batch)."""
    kind = _resolve_layout(x, layout)
    if kind == "NHWC":
        x = x.permute(0, 3, 1, 2)
    elif kind == "NHW":
        x = x.unsqueeze(1)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if x.dtype == torch.uint8:  # cheapest place for a layout copy: one byte per element
        x = x.contiguous(memory_format=fmt)
    x = x.to(torch.float32, copy=True)
    if mean is not None and std is not None:
        if mean.shape[1] not in (1, x.shape[1]):
            raise ValueError(
                f"mean/std have {mean.shape[1]} channels but the images have {x.shape[1]} "
                f"(shape {tuple(x.shape)} as NCHW)"
            )
        x.sub_(mean).div_(std)
    if flip_p > 0.0 or erase_p > 0.0:
        if generator is None:
            raise ValueError("flip/erase need a generator")
        if flip_p > 0.0:
            x = random_flip(x, flip_p, generator)
        if erase_p > 0.0:
            x = random_erase(x, erase_p, generator)
    if dtype != torch.float32:
        x = x.to(dtype)
    return x.contiguous(memory_format=fmt)


def channel_tensor(
    values: float | Sequence[float] | torch.Tensor | None,
    name: str,
    device: torch.device,
    scale: float = 1.0,
) -> torch.Tensor | None:
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().reshape(-1).tolist()
    vals = [float(values)] if isinstance(values, (int, float)) else [float(v) for v in values]
    if not vals:
        raise ValueError(f"{name} must be a number or a non-empty sequence, got {values!r}")
    if not all(np.isfinite(v) for v in vals):
        raise ValueError(f"{name} must be finite, got {vals}")
    if name == "std" and any(v == 0 for v in vals):
        raise ValueError(f"std must not contain 0, got {vals}")
    px = [v * scale for v in vals]
    return torch.tensor(px, dtype=torch.float32, device=device).view(1, -1, 1, 1)
