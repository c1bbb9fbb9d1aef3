"""Fields through a packed set: records written with a schema load into the same batches, byte
for byte, as the in-memory source they were written from, with and without workers."""

from __future__ import annotations

import numpy as np
import pytest
from fields_source import FieldsSource, all_batches, assert_same

import stoker
from stoker.formats.recordio import (
    IRHeader,
    RecordWriter,
    make_manifest,
    pack_header,
    shard_entry,
    write_manifest,
)
from stoker.loader.sources.records import RecordSource
from stoker.transforms import Compose, HorizontalFlip, RandomCrop


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[str, FieldsSource]:
    src = FieldsSource(14)
    schema = src.schema
    root = tmp_path_factory.mktemp("fields_set")
    manifest = str(root / "data.stoker.json")
    w = RecordWriter(root / "data-0.rec", schema=schema, checksums=True)
    for i, s in enumerate(src.samples):
        payload = pack_header(IRHeader(0, float(s["label"]), src.key(i), 0), s["jpeg"])
        w.write(src.key(i), payload, {n: s[n] for n in schema.stored})
    write_manifest(
        manifest, make_manifest([shard_entry(w.commit(), manifest)], schema=schema.to_json())
    )
    return manifest, src


@pytest.mark.parametrize("workers", [0, 2])
def test_a_packed_set_gives_the_batches_of_its_source(packed, workers):
    manifest, src = packed
    chain = Compose([RandomCrop(40), HorizontalFlip()])
    kw = dict(batch_size=4, transforms=chain, seed=7, shuffle=True)
    with stoker.Loader(src, workers=0, **kw) as ld:
        want = all_batches(ld)
    with stoker.Loader(manifest, workers=workers, **kw) as ld:
        assert ld.schema == src.schema  # every field of the set, without asking
        got = all_batches(ld)
    for g in got:
        g["labels"] = g["labels"].astype(np.int64)
    assert_same(want, got)


def test_a_packed_set_resumes_mid_epoch_with_its_fields(packed):
    manifest, _src = packed
    kw = dict(batch_size=4, seed=1, shuffle=True, transforms=RandomCrop(40))
    kw["fields"] = ["boxes", "classes", "caption", "size"]
    with stoker.Loader(manifest, workers=2, **kw) as ld:
        full = all_batches(ld)
        ld.set_epoch(0)
        it = iter(ld)
        next(it)
        state = ld.state_dict()
    with stoker.Loader(RecordSource(manifest), workers=0, **kw) as ld:
        ld.load_state_dict(state)
        rest = all_batches(ld)
    assert list(full[0]["fields"]) == ["boxes", "classes", "caption", "size"]
    assert_same(full[1:], rest)
