"""EarlyStopping: patience, min_delta, both modes, and the best checkpoint replaced atomically."""

from __future__ import annotations

import json
import os

import pytest

from stoker.train import EarlyStopping


def run(stopper, values):
    improved = [stopper.step(v) for v in values]
    return improved


def test_patience_in_min_mode():
    s = EarlyStopping(2)
    assert run(s, [1.0, 0.8, 0.9, 0.85]) == [True, True, False, False]
    assert s.should_stop and s.best == 0.8 and s.best_epoch == 1 and s.counter == 2


def test_an_improvement_resets_the_counter():
    s = EarlyStopping(2)
    run(s, [1.0, 1.1, 0.9, 1.2])
    assert not s.should_stop and s.counter == 1 and s.best_epoch == 2
    s.step(1.3)
    assert s.should_stop


def test_equal_values_and_min_delta():
    s = EarlyStopping(3, min_delta=0.05)
    # 0.97 and 0.951 are not better than 1.0 by more than 0.05; 0.94 is
    assert run(s, [1.0, 1.0, 0.97, 0.94, 0.951]) == [True, False, False, True, False]
    assert s.best == 0.94 and s.counter == 1


def test_max_mode_for_accuracy():
    s = EarlyStopping(1, min_delta=0.01, mode="max")
    assert run(s, [0.5, 0.7, 0.705]) == [True, True, False]
    assert s.should_stop and s.best == 0.7


def test_nan_is_never_an_improvement():
    s = EarlyStopping(2)
    assert run(s, [float("nan"), 1.0, float("nan"), float("nan")]) == [False, True, False, False]
    assert s.should_stop and s.best == 1.0


def test_explicit_epoch_numbers():
    s = EarlyStopping(5)
    s.step(1.0, epoch=10)
    s.step(0.5, epoch=12)
    assert s.best_epoch == 12


def write_bytes(obj, f):
    f.write(obj)


def test_best_checkpoint_saved_through_the_save_function(tmp_path):
    path = tmp_path / "best.ckpt"
    s = EarlyStopping(3, path=path, save=write_bytes)
    s.step(1.0, b"epoch0")
    assert path.read_bytes() == b"epoch0"
    s.step(2.0, b"epoch1")  # worse: not saved
    assert path.read_bytes() == b"epoch0"
    s.step(0.5, b"epoch2")
    assert path.read_bytes() == b"epoch2"
    assert sorted(os.listdir(tmp_path)) == ["best.ckpt"]  # no .partial left behind


class Boom(RuntimeError):
    pass


def test_failed_save_leaves_the_previous_checkpoint_and_state(tmp_path):
    path = tmp_path / "best.ckpt"
    calls = []

    def flaky(obj, f):
        calls.append(obj)
        f.write(b"half a checkpo")
        if obj == b"bad":
            raise Boom("disk full")
        f.write(obj)

    s = EarlyStopping(3, path=path, save=flaky)
    s.step(1.0, b"good")
    before = path.read_bytes()
    with pytest.raises(Boom):
        s.step(0.1, b"bad")
    assert path.read_bytes() == before  # the old best is intact
    assert not (tmp_path / "best.ckpt.partial").exists()
    assert s.best == 1.0 and s.best_epoch == 0  # not updated by the failed improvement
    s.step(0.2, b"retry")
    assert path.read_bytes().endswith(b"retry") and s.best == 0.2


def test_torch_save_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "best.pt"
    s = EarlyStopping(2, path=path, save=torch.save)
    s.step(0.7, model.state_dict())
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["weight"], model.weight.detach())


def test_state_dict_round_trips_through_json():
    s = EarlyStopping(3, min_delta=0.1, mode="max")
    run(s, [0.1, 0.5, 0.45])
    state = json.loads(json.dumps(s.state_dict()))
    t = EarlyStopping(3, min_delta=0.1, mode="max")
    t.load_state_dict(state)
    assert (t.best, t.best_epoch, t.counter, t.steps) == (0.5, 1, 1, 3)
    t.step(0.4)
    t.step(0.3)
    assert t.should_stop
    with pytest.raises(ValueError, match="mode"):
        EarlyStopping(3).load_state_dict(state)
    with pytest.raises(ValueError, match="counter"):
        t.load_state_dict(state | {"counter": -1})
    with pytest.raises(ValueError, match="missing"):
        t.load_state_dict({"mode": "max"})


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((0,), {}, "patience"),
        ((2,), {"min_delta": -0.1}, "min_delta"),
        ((2,), {"mode": "lowest"}, "mode"),
        ((2,), {"path": "x.pt"}, "both path= and save="),
    ],
)
def test_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        EarlyStopping(*args, **kwargs)


def test_state_required_when_saving(tmp_path):
    s = EarlyStopping(2, path=tmp_path / "b", save=write_bytes)
    with pytest.raises(ValueError, match="pass the object to save"):
        s.step(1.0)
