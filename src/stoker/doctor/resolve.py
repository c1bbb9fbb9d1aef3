"""Turning what the user names (``--transforms``, ``--model``: a preset, ``"module:attr"`` or
an object) into the transform and the model the doctor measures."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

__all__ = ["resolve_model", "resolve_transforms"]


def _import_attr(spec: str, what: str) -> Any:
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise ValueError(f"{what} {spec!r}: expected 'module:attribute'")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ValueError(f"{what} {spec!r}: cannot import {mod_name!r} ({e})") from e
    obj: Any = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ValueError(f"{what} {spec!r}: {mod_name!r} has no attribute {attr!r}") from e
    return obj


def resolve_transforms(t: Any) -> tuple[Any, str]:
    """``None``/``"none"``, a preset name, ``"module:attr"`` or a transform -> (transform, label)."""
    if t is None or (isinstance(t, str) and t == "none"):
        return None, "none"
    if isinstance(t, str):
        return (_transform_from_spec(t), t) if ":" in t else (_preset(t), t)
    if not callable(t):
        raise TypeError(
            f"transforms must be a Transform, a preset name or 'module:attr', got {type(t).__name__}"
        )
    return t, type(t).__name__


def _transform_from_spec(spec: str) -> Any:
    """``module:attr`` of a transform, of its class or of a function returning one."""
    obj = _import_attr(spec, "--transforms")
    if isinstance(obj, type) or (not _is_transform(obj) and callable(obj) and _takes_no_args(obj)):
        obj = obj()
    if not callable(obj):
        raise TypeError(f"--transforms {spec!r} is not a transform (a callable taking (img, rng))")
    return obj


def _preset(name: str) -> Any:
    try:
        from stoker.transforms.presets import get_preset
    except ImportError as e:
        raise ValueError(
            f"--transforms {name!r}: presets are not available in this install ({e})"
        ) from e
    return get_preset(name)


def _is_transform(obj: Any) -> bool:
    try:
        from stoker.transforms.base import Transform
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, Transform)


def _takes_no_args(fn: Any) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in sig.parameters.values()
    )


def resolve_model(model: Any) -> Any:
    """An ``nn.Module``, a callable returning one, or ``"module:attr"`` -> the module."""
    if isinstance(model, str):
        model = _import_attr(model, "--model")
    import torch

    if isinstance(model, torch.nn.Module):
        return model
    if callable(model):
        m = model()
        if isinstance(m, torch.nn.Module):
            return m
        raise TypeError(
            f"--model: calling {model!r} gave {type(m).__name__}, not a torch.nn.Module"
        )
    raise TypeError(
        f"--model must be a torch.nn.Module or a callable returning one, got {type(model).__name__}"
    )
