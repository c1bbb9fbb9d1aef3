"""Layer 1: pure index arithmetic (epoch orders, rank splits, shard-aware order, class balance,
length and aspect-ratio buckets, weighted mixtures of sets, the rest of an epoch resumed on another number of ranks).

Every sampler is a pure function of its configuration and the epoch: ``indices(epoch)`` gives
this rank's global positions, ``len()`` their count, ``batch_widths(epoch, batch_size)`` an
optional width per batch and ``fingerprint()`` a JSON-safe description. They also iterate ints
and honour ``set_epoch``, so a plain ``torch.utils.data.DataLoader(sampler=...)`` accepts them.
"""

from stoker.sampling.aspect import AspectBuckets
from stoker.sampling.balanced import ClassBalanced
from stoker.sampling.base import Sampler
from stoker.sampling.buckets import LengthBuckets, ProportionalWidth
from stoker.sampling.elastic import ElasticOrder, Rest, Segment, split_rest
from stoker.sampling.filters import FrequencyReport, filter_by_label_frequency
from stoker.sampling.mixture import MixtureOrder
from stoker.sampling.order import EpochOrder, Subset, split_for_rank
from stoker.sampling.shards import ShardOrder

__all__ = [
    "AspectBuckets",
    "ClassBalanced",
    "ElasticOrder",
    "EpochOrder",
    "FrequencyReport",
    "LengthBuckets",
    "MixtureOrder",
    "ProportionalWidth",
    "Rest",
    "Sampler",
    "Segment",
    "ShardOrder",
    "Subset",
    "filter_by_label_frequency",
    "split_for_rank",
    "split_rest",
]
