"""Resumable state: the remainder after a resume is identical, whatever the worker count, and
a state that does not belong to the loader is refused with the field named."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loader_helpers import STATE_FIELDS, Misbehave, RandCrop

from stoker import IncompatibleStateError
from stoker.loader import Loader

KW = dict(batch_size=5, transforms=RandCrop(24, 30), shuffle=True, seed=3)


def run(loader, stop=None):
    """Batches (epoch, number, images, keys) until ``stop`` batches were taken (None: 2 epochs)."""
    out = []
    for _ in range(2):
        for b in loader:
            out.append((b.epoch, b.number, b.images.copy(), b.keys.copy()))
            if stop is not None and len(out) == stop:
                return out
    return out


@pytest.fixture(scope="module")
def reference(folder):
    with Loader(folder, workers=0, **KW) as ld:
        return run(ld)


@pytest.mark.parametrize("save_workers,load_workers", [(2, 0), (0, 1), (1, 2), (2, 4)])
@pytest.mark.parametrize("point", [0, 1, 5, 9, 17])
def test_resume_gives_identical_remainder(folder, reference, save_workers, load_workers, point):
    nb = len(reference) // 2  # 9 batches per epoch: points cover start, 1, mid, last, next epoch
    with Loader(folder, workers=save_workers, **KW) as ld:
        head = run(ld, stop=point) if point else []
        state = json.loads(json.dumps(ld.state_dict()))
    assert len(head) == point
    with Loader(folder, workers=load_workers, **dict(KW, seed=None)) as ld2:
        ld2.load_state_dict(state)
        tail = []
        while len(head) + len(tail) < len(reference):
            tail.extend((b.epoch, b.number, b.images.copy(), b.keys.copy()) for b in ld2)
    got = head + tail
    assert len(got) == len(reference) == 2 * nb
    for a, b in zip(got, reference):
        assert a[:2] == b[:2]
        np.testing.assert_array_equal(a[3], b[3])
        np.testing.assert_array_equal(a[2], b[2])


def test_a_seed_drawn_loader_that_already_ran_resumes_with_the_saved_seed(folder, reference):
    """A loader made with seed=None whose workers already run takes the saved seed on
    load_state_dict: its workers restart with it, so augmentation matches the saved run."""
    with Loader(folder, workers=2, **KW) as ld:
        run(ld, stop=3)
        state = json.loads(json.dumps(ld.state_dict()))
    with Loader(folder, workers=2, **dict(KW, seed=None)) as ld2:
        next(iter(ld2))  # workers start with the drawn seed
        ld2.load_state_dict(state)
        tail = run(ld2, stop=4)
    for a, b in zip(tail, reference[3:7]):
        assert a[:2] == b[:2]
        np.testing.assert_array_equal(a[3], b[3])
        np.testing.assert_array_equal(a[2], b[2])


def test_state_at_epoch_end_starts_next_epoch(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=20, workers=0, seed=1) as ld:
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.state_dict()
    assert (state["epoch"], state["batch"]) == (1, 0)


def test_resume_after_skips_is_exact(arrays):
    x, y = arrays
    kw = dict(
        batch_size=8,
        transforms=Misbehave("raise", at=3),
        on_error="skip",
        max_bad_fraction=0.5,
        seed=2,
        shuffle=True,
    )
    with Loader((x, y), workers=2, **kw) as ld:
        full = [b.keys.copy() for b in ld]
    with Loader((x, y), workers=2, **kw) as ld:
        it = iter(ld)
        head = [next(it).keys.copy() for _ in range(4)]
        state = ld.state_dict()
        bad_seen = ld.stats["bad_samples"]
    with Loader((x, y), workers=1, **kw) as ld:
        ld.load_state_dict(state)
        assert ld.stats["bad_samples"] == bad_seen
        tail = [b.keys.copy() for b in ld]
        assert ld.stats["bad_samples"] == 1
    for a, b in zip(head + tail, full):
        np.testing.assert_array_equal(a, b)


def _state(loader):
    return json.loads(json.dumps(loader.state_dict()))


def test_refuses_state_of_another_dataset_seed_or_batch_size(arrays, folder):
    x, y = arrays
    with Loader((x, y), batch_size=4, seed=1, workers=0) as ld:
        state = _state(ld)
    with Loader((x[:50], y[:50]), batch_size=4, seed=1, workers=0) as other:
        with pytest.raises(IncompatibleStateError, match="dataset: the state is for .*len=60"):
            other.load_state_dict(state)
    with Loader((x, y), batch_size=4, seed=2, workers=0) as other:
        with pytest.raises(IncompatibleStateError, match="seed"):
            other.load_state_dict(state)
    with Loader((x, y), batch_size=6, seed=1, workers=0) as other:
        with pytest.raises(IncompatibleStateError, match="batch_size"):
            other.load_state_dict(state)
    with Loader((x, y), batch_size=4, seed=1, shuffle=True, workers=0) as other:
        with pytest.raises(IncompatibleStateError, match="sampler"):
            other.load_state_dict(state)
    with Loader((x, y), batch_size=4, seed=1, workers=0) as same:
        bad = dict(state, version=99)
        with pytest.raises(IncompatibleStateError, match="version"):
            same.load_state_dict(bad)


@pytest.mark.parametrize(
    "field,value,exc",
    [
        ("epoch", -1, ValueError),
        ("epoch", 1 << 70, ValueError),
        ("epoch", "3", TypeError),
        ("batch", 10_000, ValueError),
        ("batch", 1.5, TypeError),
        ("seed", True, TypeError),
        ("bad", {"epoch": -2, "total": 0}, ValueError),
        ("bad", [], ValueError),
        ("extra", 1, ValueError),
        ("dataset", "x" * (2 << 20), ValueError),
    ],
)
def test_hostile_values_name_the_field(arrays, field, value, exc):
    x, y = arrays
    with Loader((x, y), batch_size=4, seed=1, workers=0) as ld:
        state = dict(_state(ld), **{field: value})
        name = field.split(".")[0] if field != "dataset" else "bytes"
        with pytest.raises(exc, match=name):
            ld.load_state_dict(state)
        missing = _state(ld)
        del missing["epoch"]
        with pytest.raises(ValueError, match="epoch"):
            ld.load_state_dict(missing)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.dictionaries(
        st.sampled_from([*STATE_FIELDS, "zz"]),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers()
            | st.floats(allow_nan=False)
            | st.text(max_size=5),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
            max_leaves=5,
        ),
    )
)
def test_fuzzed_states_raise_value_or_type_errors(arrays, state):
    x, y = arrays
    ld = Loader((x, y), batch_size=4, seed=1, workers=0)
    try:
        good = _state(ld)
        merged = dict(good, **state)
        try:
            ld.load_state_dict(merged)
        except (ValueError, TypeError):
            pass
        else:
            assert merged["epoch"] >= 0  # accepted only when every field was valid
    finally:
        ld.close()
