"""Learning-rate scaling with the batch size, and a warm-up schedule.

Seed 001's rule ``lr = 0.00125 * num_gpu * samples_per_gpu`` is the linear scaling rule with a
reference learning rate of 0.00125 *per sample*::

    scale_lr(0.00125, num_gpu * samples_per_gpu, base_batch_size=1)
    # 8 GPUs x 2 images: 0.02, the same as scale_lr(0.02, 16, base_batch_size=16)

Written against the usual reference batch of 256 that is ``scale_lr(0.32, batch_size)``.
Large batches usually also want a warm-up (Goyal et al. 2017): :func:`warmup_schedule`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["WarmupCosine", "scale_lr", "warmup_schedule"]


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return float(value)


def scale_lr(
    base_lr: float, batch_size: int, base_batch_size: int = 256, *, rule: str = "linear"
) -> float:
    """The learning rate for ``batch_size`` given one tuned for ``base_batch_size``.

    ``rule="linear"``: ``base_lr * batch_size / base_batch_size`` (SGD, Goyal et al.);
    ``rule="sqrt"``: ``base_lr * sqrt(batch_size / base_batch_size)`` (often better for Adam).
    ``batch_size`` is the global batch: per-GPU batch times the number of GPUs.

    >>> scale_lr(0.1, 1024)
    0.4
    >>> round(scale_lr(0.00125, 8 * 2, base_batch_size=1), 6)
    0.02
    """
    base_lr = _positive("base_lr", base_lr)
    ratio = _positive("batch_size", batch_size) / _positive("base_batch_size", base_batch_size)
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    raise ValueError(f"rule must be 'linear' or 'sqrt', got {rule!r}")


def warmup_schedule(
    step: int,
    *,
    warmup_steps: int,
    base_lr: float,
    total_steps: int | None = None,
    final_lr: float = 0.0,
    start_factor: float = 0.0,
) -> float:
    """The learning rate at ``step`` (0-based, counted in optimizer steps).

    Linear warm-up from ``start_factor * base_lr`` to ``base_lr`` over ``warmup_steps``
    steps; then constant (``total_steps=None``) or a half-cosine down to ``final_lr`` at
    ``total_steps`` (and ``final_lr`` after it).

    >>> warmup_schedule(0, warmup_steps=4, base_lr=1.0), warmup_schedule(2, warmup_steps=4, base_lr=1.0)
    (0.0, 0.5)
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
    base_lr = _positive("base_lr", base_lr)
    if not 0.0 <= start_factor <= 1.0:
        raise ValueError(f"start_factor must be in [0, 1], got {start_factor!r}")
    if not (math.isfinite(final_lr) and final_lr >= 0):
        raise ValueError(f"final_lr must be finite and >= 0, got {final_lr!r}")
    if total_steps is not None and (
        isinstance(total_steps, bool)
        or not isinstance(total_steps, int)
        or total_steps < warmup_steps
    ):
        raise ValueError(
            f"total_steps must be an int >= warmup_steps={warmup_steps}, got {total_steps!r}"
        )
    if step < warmup_steps:
        return base_lr * (start_factor + (1.0 - start_factor) * step / warmup_steps)
    if total_steps is None:
        return base_lr
    if step >= total_steps:
        return final_lr
    span = total_steps - warmup_steps
    progress = (step - warmup_steps) / span
    return final_lr + (base_lr - final_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class WarmupCosine:
    """:func:`warmup_schedule` as a picklable object: ``sched(step) -> lr``.

    ``sched.factor(step)`` is ``lr / base_lr``, the multiplier
    ``torch.optim.lr_scheduler.LambdaLR(opt, sched.factor)`` expects.
    """

    base_lr: float
    warmup_steps: int
    total_steps: int | None = None
    final_lr: float = 0.0
    start_factor: float = 0.0

    def __post_init__(self) -> None:
        self(0)  # validates every field

    def __call__(self, step: int) -> float:
        return warmup_schedule(
            step,
            warmup_steps=self.warmup_steps,
            base_lr=self.base_lr,
            total_steps=self.total_steps,
            final_lr=self.final_lr,
            start_factor=self.start_factor,
        )

    def factor(self, step: int) -> float:
        return self(step) / self.base_lr
