"""Layer 3: pack image folders (or im2rec lists) into RecordIO shards; make sample data."""

from stoker.pack.packer import PackReport, pack
from stoker.pack.sample_data import make_sample_data

__all__ = ["PackReport", "make_sample_data", "pack"]
