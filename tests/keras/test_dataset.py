"""KerasDataset as Keras drives it: exact length, epoch alignment, wrap, dtypes, arguments.

The PyDataset protocol is driven by hand in the order Keras 3 calls it (``on_epoch_begin``,
``__getitem__`` per step, ``on_epoch_end``) over a real in-process loader (``workers=0``).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from keras_data import Sleep, decode_index, index_images

import stoker
import stoker.keras
from stoker.keras import KerasDataset


def keras_epoch(ds: KerasDataset, order=None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One Keras epoch: the sample indices (from the pixels) and labels of every batch."""
    ds.on_epoch_begin()
    seen, labels = [], []
    for i in order if order is not None else range(len(ds)):
        x, y = ds[i]
        seen.append(decode_index(x))
        labels.append(np.asarray(y))
    ds.on_epoch_end()
    return seen, labels


def reference_stream(n: int, batch_size: int, passes: int, seed: int) -> list[np.ndarray]:
    """The batches a plain loader yields over ``passes`` epochs, as sample indices."""
    x, y = index_images(n)
    out = []
    with stoker.Loader((x, y), batch_size=batch_size, shuffle=True, seed=seed, workers=0) as ld:
        for _ in range(passes):
            out += [decode_index(b.images) for b in ld]
    return out


def make(n=64, batch_size=16, seed=3, **kw) -> KerasDataset:
    x, y = index_images(n)
    loader = stoker.Loader((x, y), batch_size=batch_size, shuffle=True, seed=seed, workers=0)
    return KerasDataset(loader, **kw)


def test_public_names():
    assert (
        stoker.keras.__all__
        == sorted(set(stoker.keras.__all__))
        == ["KerasDataset", "LoaderCheckpoint", "dataset", "fit_resumable"]
    )
    for name in stoker.keras.__all__:
        assert getattr(stoker.keras, name) is not None


def test_len_is_the_loaders_or_steps():
    x, y = index_images(100)
    with stoker.Loader((x, y), batch_size=16, workers=0) as ld:
        ds = KerasDataset(ld, close_loader=False)
        assert len(ds) == len(ld) == 7 and ds.num_batches == 7
        assert len(KerasDataset(ld, steps=3, close_loader=False)) == 3
        assert len(KerasDataset(ld, steps=20, close_loader=False)) == 20


def test_each_keras_epoch_is_one_loader_epoch_in_any_index_order():
    n = 64
    with make(n) as ds:
        ep0, lab0 = keras_epoch(ds, order=[2, 0, 3, 1])  # fit(shuffle=True) permutes indices
        assert ds.loader.epoch == 1  # on_epoch_end advanced the loader
        ep1, _ = keras_epoch(ds)
        assert ds.loader.epoch == 2
    for ep in (ep0, ep1):
        assert sorted(np.concatenate(ep).tolist()) == list(range(n))
    assert not np.array_equal(np.concatenate(ep0), np.concatenate(ep1))  # reshuffled
    for s, lab in zip(ep0, lab0):  # labels travel with their images
        assert np.array_equal(s, lab)
    assert [b.tolist() for b in ep0 + ep1] == [b.tolist() for b in reference_stream(n, 16, 2, 3)]


@pytest.mark.parametrize("steps", [3, 6])
def test_steps_other_than_one_pass_flow_on_across_loader_epochs(steps):
    n, bs = 64, 16  # 4 batches per loader epoch
    with make(n, bs, steps=steps) as ds:
        got = []
        for _ in range(4):
            got += keras_epoch(ds)[0]
    want = reference_stream(n, bs, passes=(4 * steps + 3) // 4, seed=3)[: 4 * steps]
    assert [b.tolist() for b in got] == [b.tolist() for b in want]


def test_model_build_peek_is_served_again_as_the_first_batch():
    """Keras pulls one batch to build an unbuilt model, then ends the "epoch"; the real first
    epoch must still be exactly loader epoch 0."""
    with make() as ds:
        peek, _ = keras_epoch(ds, order=[2])
        ep0, _ = keras_epoch(ds)
        assert ds.loader.epoch == 1
    assert np.array_equal(ep0[0], peek[0])
    assert [b.tolist() for b in ep0] == [b.tolist() for b in reference_stream(64, 16, 1, 3)]


def test_validation_pattern_reset_then_epoch():
    """evaluate() inside fit calls on_epoch_end (reset) before each pass: nothing is lost."""
    with make() as ds:
        for _ in range(3):
            ds.on_epoch_end()
            ep, _ = keras_epoch(ds)
            assert sorted(np.concatenate(ep).tolist()) == list(range(64))


def test_uint8_by_default_float_on_request():
    x = np.random.default_rng(0).integers(0, 256, (32, 8, 8), dtype=np.uint8)
    y = np.arange(32)
    with stoker.Loader((x, y), batch_size=8, workers=0) as ld:
        ds = KerasDataset(ld, close_loader=False)
        xb, yb = ds[0]
        assert xb.dtype == np.uint8 and xb.shape == (8, 8, 8, 1)  # channel axis added
        assert np.array_equal(xb[..., 0], x[:8]) and np.array_equal(yb, y[:8])
    for dtype in ("float16", "float32"):
        with stoker.Loader((x, y), batch_size=8, workers=0) as ld:
            xb, _ = KerasDataset(ld, x_dtype=dtype, close_loader=False)[0]
            assert xb.dtype == np.dtype(dtype) and xb.shape == (8, 8, 8, 1)
            np.testing.assert_allclose(xb[..., 0], x[:8] / 255, rtol=1e-3, atol=1e-3)
    with stoker.Loader((x, y), batch_size=8, workers=0) as ld:
        xb, _ = KerasDataset(ld, x_dtype="float32", scale=1.0, close_loader=False)[0]
        assert np.array_equal(xb[..., 0], x[:8].astype(np.float32))


def test_keras_never_gets_a_pool():
    with make() as ds:
        assert ds.workers == 1 and ds.use_multiprocessing is False and ds.max_queue_size == 1
        with pytest.raises(ValueError, match="Loader"):
            ds.workers = 8
        with pytest.raises(ValueError, match="worker processes"):
            ds.use_multiprocessing = True
        ds.workers = 1  # a no-op is fine


def test_bad_arguments_and_indices():
    x, y = index_images(32)
    with stoker.Loader((x, y), batch_size=8, workers=0) as ld:
        for kw, match in [
            ({"x_dtype": "int32"}, "float dtype"),
            ({"scale": 0}, "scale"),
            ({"scale": float("nan")}, "scale"),
            ({"steps": 0}, "steps"),
            ({"steps": 2.5}, "steps"),
        ]:
            with pytest.raises(ValueError, match=match):
                KerasDataset(ld, close_loader=False, **kw)
        with pytest.raises(TypeError, match="stoker.Loader"):
            KerasDataset(object())
        ds = KerasDataset(ld, close_loader=False)
        with pytest.raises(IndexError, match="out of range"):
            ds[4]
        with pytest.raises(IndexError):
            ds[-1]
        with pytest.raises(TypeError):
            ds["0"]


def test_close_closes_the_loader_unless_told_not_to():
    x, y = index_images(32)
    ld = stoker.Loader((x, y), batch_size=8, workers=0)
    ds = KerasDataset(ld, close_loader=False)
    ds[0]
    ds.close()
    with pytest.raises(ValueError, match="closed"):
        ds[1]
    assert [b.number for b in ld] == [1, 2, 3]  # still usable: the epoch goes on
    with KerasDataset(ld) as ds2:
        ds2[0]
    with pytest.raises(Exception):  # noqa: B017 - the loader's own "closed" error
        list(ld)


def test_dataset_builds_and_owns_a_loader():
    x, y = index_images(40)
    with stoker.keras.dataset((x, y), batch_size=8, workers=0, x_dtype="float32", scale=1.0) as ds:
        assert len(ds) == 5
        ep, _ = keras_epoch(ds)
        loader = ds.loader
    assert sorted(np.concatenate(ep).tolist()) == list(range(40))
    with pytest.raises(Exception):  # noqa: B017 - closed with the dataset
        list(loader)


def test_torch_backend_gets_the_slot_view_and_keras_copies_it():
    """No copy here on the torch backend: Keras's own conversion copies the batch before it
    asks for the next one (if a Keras release stops copying, this fails: copy then)."""
    import keras

    assert keras.backend.backend() == "torch"
    x, y = index_images(32)
    with stoker.Loader((x, y), batch_size=8, workers=0) as ld:
        ds = KerasDataset(ld, close_loader=False)
        ds.on_epoch_begin()
        xb, _ = ds[0]
        assert not xb.flags.owndata  # the loader's slot, not a copy
        t = keras.ops.convert_to_tensor(xb)
        assert t.data_ptr() != xb.ctypes.data
        ds.close()
        ds = KerasDataset(ld, x_dtype="float16", close_loader=False)
        ds.on_epoch_begin()
        xf, _ = ds[1]
        assert xf.flags.owndata


def test_float_batches_are_cast_not_scaled_again():
    from stoker.transforms import Normalize

    x = np.random.default_rng(1).integers(0, 256, (16, 8, 8), dtype=np.uint8)
    with stoker.Loader(
        (x, np.arange(16)), batch_size=8, transforms=Normalize(0.0, 1.0), workers=0
    ) as ld:
        xb, _ = KerasDataset(ld, x_dtype="float16", close_loader=False)[0]
    assert xb.dtype == np.float16
    np.testing.assert_allclose(xb[..., 0], x[:8] / 255, rtol=1e-3, atol=1e-3)


def test_an_interrupted_epoch_goes_on_in_the_next_fit():
    """fit stopped early (stop_training: no on_epoch_end) and called again: the next batches
    are the rest of the same loader epoch, nothing skipped or served twice."""
    with make() as ds:
        ds.on_epoch_begin()
        first = [decode_index(ds[i][0]) for i in range(2)]  # then fit stops
        rest, _ = keras_epoch(ds)  # the next fit's first epoch
    stream = reference_stream(64, 16, 2, 3)
    assert [b.tolist() for b in first + rest] == [b.tolist() for b in stream[:6]]


def test_requests_outside_an_epoch_look_ahead():
    """The TensorFlow backend pulls ds[0] and ds[1] to build its tf.data signature before the
    epoch starts, and expects them again in the epoch: nothing is consumed by the look-ahead,
    and the epoch is still exactly one loader epoch in order."""
    with make() as ds:
        ahead = [decode_index(ds[i][0]) for i in (0, 1)]
        again = decode_index(ds[1][0])
        assert np.array_equal(again, ahead[1])
        assert ds[0][0].flags.owndata  # kept across requests: a copy, not the loader's slot
        ds.on_epoch_end()  # Keras resets before the first epoch; the look-ahead stays
        ep0, labels = keras_epoch(ds, order=[3, 1, 0, 2])
        ep1, _ = keras_epoch(ds)
    assert [b.tolist() for b in ep0[:2]] == [b.tolist() for b in ahead]
    assert [b.tolist() for b in ep0 + ep1] == [b.tolist() for b in reference_stream(64, 16, 2, 3)]
    for s, lab in zip(ep0, labels):
        assert np.array_equal(s, lab)


def test_close_waits_for_a_request_in_flight_in_another_thread():
    """Under TensorFlow, tf.data threads call __getitem__; when fit stops early, one may still
    be waiting for a batch while the main thread closes the dataset. close() waits for it;
    the request gets its batch, and later ones are refused."""
    entered = threading.Event()

    class Watched(KerasDataset):
        def _next_batch(self):
            entered.set()
            return super()._next_batch()

    x, y = index_images(64)
    ds = Watched(stoker.Loader((x, y), batch_size=16, transforms=Sleep(0.03), workers=1))
    ds.on_epoch_begin()
    first = decode_index(ds[0][0])
    entered.clear()
    got: dict = {}

    def request() -> None:
        try:
            got["batch"] = decode_index(ds[1][0])
        except Exception as exc:  # noqa: BLE001 - reported below
            got["error"] = exc

    t = threading.Thread(target=request)
    t.start()
    assert entered.wait(10)
    ds.close()  # the batch takes 16 x 30 ms on one worker: the request is still waiting
    t.join(10)
    assert not t.is_alive()
    assert "error" not in got, got
    assert first.tolist() == list(range(16)) and got["batch"].tolist() == list(range(16, 32))
    with pytest.raises(ValueError, match="closed"):
        ds[2]
