"""A DataLoader user's habits meet a sentence that names stoker's spelling, not a bare
``TypeError``; a typo gets the closest argument."""

from __future__ import annotations

import numpy as np
import pytest

import stoker

X = np.zeros((4, 8, 8, 3), np.uint8)


@pytest.mark.parametrize(
    "name,value,says",
    [
        ("num_workers", 2, "workers="),
        ("prefetch_factor", 4, "prefetch="),
        ("persistent_workers", True, "always persist"),
        ("pin_memory", True, "CudaPrefetcher"),
        ("collate_fn", None, "already arrays"),
        ("batch_sampler", None, "sampler="),
    ],
)
def test_dataloader_names_are_answered_with_stoker_names(name, value, says):
    with pytest.raises(TypeError, match=f"'{name}'.*{says}"):
        stoker.Loader((X, None), batch_size=2, **{name: value})


@pytest.mark.parametrize("typo,fix", [("shufle", "shuffle="), ("batch_sizes", "batch_size=")])
def test_a_typo_gets_the_closest_argument(typo, fix):
    kw = {"batch_size": 2, typo: 1}
    with pytest.raises(TypeError, match=f"did you mean {fix}"):
        stoker.Loader((X, None), **kw)


def test_nothing_is_left_open_after_the_refusal():
    with pytest.raises(TypeError):
        stoker.Loader((X, None), batch_size=2, num_workers=2)
    with stoker.Loader((X, None), batch_size=2, workers=0) as ld:
        assert len(list(ld)) == 2
