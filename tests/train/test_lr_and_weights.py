"""scale_lr, warmup_schedule and class_weights against hand-computed values."""

from __future__ import annotations

import doctest
import math
import pickle

import numpy as np
import pytest

import stoker.train.lr
import stoker.train.text
import stoker.train.weights
from stoker.train import WarmupCosine, class_weights, scale_lr, warmup_schedule


def test_scale_lr_rules():
    assert scale_lr(0.1, 256) == pytest.approx(0.1)
    assert scale_lr(0.1, 1024) == pytest.approx(0.4)
    assert scale_lr(0.1, 64) == pytest.approx(0.025)
    assert scale_lr(0.1, 1024, rule="sqrt") == pytest.approx(0.2)
    assert scale_lr(3e-4, 32, base_batch_size=8, rule="sqrt") == pytest.approx(6e-4)


@pytest.mark.parametrize(("gpus", "per_gpu"), [(1, 2), (8, 2), (4, 16)])
def test_seed_rule_is_linear_scaling_per_sample(gpus, per_gpu):
    seed_lr = 0.00125 * gpus * per_gpu  # seed 001
    assert scale_lr(0.00125, gpus * per_gpu, base_batch_size=1) == pytest.approx(seed_lr)
    assert scale_lr(0.02, gpus * per_gpu, base_batch_size=16) == pytest.approx(seed_lr)


@pytest.mark.parametrize(
    ("args", "kwargs", "exc"),
    [
        ((0.0, 256), {}, ValueError),
        ((0.1, 0), {}, ValueError),
        ((0.1, 256, -1), {}, ValueError),
        ((float("nan"), 256), {}, ValueError),
        ((0.1, "256"), {}, TypeError),
        ((0.1, 256), {"rule": "log"}, ValueError),
    ],
)
def test_scale_lr_rejects_bad_arguments(args, kwargs, exc):
    with pytest.raises(exc):
        scale_lr(*args, **kwargs)


def test_warmup_then_cosine():
    kw = {"warmup_steps": 10, "base_lr": 0.4, "total_steps": 110, "final_lr": 0.004}
    assert warmup_schedule(0, **kw) == 0.0
    assert warmup_schedule(5, **kw) == pytest.approx(0.2)
    assert warmup_schedule(10, **kw) == pytest.approx(0.4)
    assert warmup_schedule(60, **kw) == pytest.approx((0.4 + 0.004) / 2)  # half-way down
    assert warmup_schedule(110, **kw) == pytest.approx(0.004)
    assert warmup_schedule(500, **kw) == pytest.approx(0.004)
    lrs = [warmup_schedule(s, **kw) for s in range(120)]
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:11]))  # rises
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then falls
    # no total: constant after warm-up; start_factor: warm-up starts above 0
    assert warmup_schedule(1000, warmup_steps=10, base_lr=0.1) == 0.1
    assert warmup_schedule(0, warmup_steps=10, base_lr=0.1, start_factor=0.1) == pytest.approx(0.01)
    assert warmup_schedule(0, warmup_steps=0, base_lr=0.1, total_steps=10) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="total_steps"):
        warmup_schedule(0, warmup_steps=10, base_lr=0.1, total_steps=5)
    with pytest.raises(ValueError, match="step"):
        warmup_schedule(-1, warmup_steps=10, base_lr=0.1)


def test_warmup_cosine_object_is_picklable_and_gives_lambda_lr_factors():
    sched = WarmupCosine(0.4, 10, total_steps=110)
    assert sched(5) == warmup_schedule(5, warmup_steps=10, base_lr=0.4, total_steps=110)
    assert sched.factor(10) == pytest.approx(1.0)
    assert pickle.loads(pickle.dumps(sched)) == sched
    with pytest.raises(ValueError):
        WarmupCosine(0.4, 10, total_steps=3)


def test_warmup_cosine_drives_a_torch_lambda_lr():
    torch = pytest.importorskip("torch")
    sched = WarmupCosine(0.4, 4, total_steps=20)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.4)
    lr_sched = torch.optim.lr_scheduler.LambdaLR(opt, sched.factor)
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        lr_sched.step()
    assert seen == pytest.approx([sched(s) for s in range(20)])


def test_class_weights_inverse_by_hand():
    labels = [0] * 6 + [1] * 3 + [2] * 1  # N = 10, C = 3
    w = class_weights(labels)
    np.testing.assert_allclose(w, [10 / (3 * 6), 10 / (3 * 3), 10 / (3 * 1)])
    counts = np.array([6, 3, 1])
    assert np.sum(w * counts) == pytest.approx(10)  # mean weight per sample is 1
    # the seed's len(labels) / count is the unnormalised form
    np.testing.assert_allclose(class_weights(labels, normalize=False), [10 / 6, 10 / 3, 10 / 1])


def test_class_weights_effective_number_by_hand():
    labels = [0] * 6 + [1] * 3 + [2] * 1
    beta = 0.9
    raw = [(1 - beta) / (1 - beta**n) for n in (6, 3, 1)]
    np.testing.assert_allclose(
        class_weights(labels, scheme="effective_number", beta=beta, normalize=False), raw
    )
    norm = class_weights(labels, scheme="effective_number", beta=beta)
    np.testing.assert_allclose(norm, np.array(raw) * 10 / np.dot(raw, [6, 3, 1]))
    # beta = 0: equal weights
    np.testing.assert_allclose(class_weights(labels, scheme="effective_number", beta=0.0), 1.0)


def test_class_weights_missing_classes_and_bad_input():
    with pytest.warns(UserWarning, match=r"1 class\(es\) have no samples and get weight 0: 1"):
        w = class_weights([0, 0, 2], num_classes=3)
    assert w[1] == 0.0 and w[0] > 0 and w[2] > 0
    assert class_weights(np.array([0.0, 1.0, 1.0], dtype=np.float32)).tolist() == pytest.approx(
        [1.5, 0.75]
    )
    for bad, exc in [
        ([], ValueError),
        ([0, -1], ValueError),
        ([0.5], ValueError),
        (["a", "b"], TypeError),
        ([[0, 1]], ValueError),
    ]:
        with pytest.raises(exc):
            class_weights(bad)
    with pytest.raises(ValueError, match="outside"):
        class_weights([0, 5], num_classes=3)
    with pytest.raises(ValueError, match="beta"):
        class_weights([0, 1], scheme="effective_number", beta=1.0)
    with pytest.raises(ValueError, match="scheme"):
        class_weights([0, 1], scheme="balanced")


def test_weighted_loss_in_torch_uses_them():
    torch = pytest.importorskip("torch")
    labels = torch.tensor([0, 0, 0, 1])
    w = torch.as_tensor(class_weights(labels.numpy()), dtype=torch.float32)
    loss = torch.nn.CrossEntropyLoss(weight=w)(torch.zeros(4, 2), labels)
    assert math.isclose(loss.item(), math.log(2), rel_tol=1e-6)


@pytest.mark.parametrize("module", [stoker.train.lr, stoker.train.weights, stoker.train.text])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0
