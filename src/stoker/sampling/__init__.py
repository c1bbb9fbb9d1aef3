"""Layer 1: pure index arithmetic (epoch orders, rank splits, class balance, length buckets)."""

from stoker.sampling.base import Sampler
from stoker.sampling.order import EpochOrder, split_for_rank

__all__ = ["EpochOrder", "Sampler", "split_for_rank"]
