"""check-resume with an augmentation policy and batch mixing in the pipeline: RandAugment draws
from each sample's generator and MixUp/CutMix from each batch's, so a run killed and resumed on
as many ranks delivers the same pixels and soft targets as an uninterrupted one."""

from __future__ import annotations

from stoker.resume import LoaderSpec, check_resume
from stoker.transforms import Compose, HorizontalFlip, MixUpCutMix, RandAugment, RandomCrop, Resize


def test_randaugment_and_mixing_resume_exactly(sets):
    chain = Compose(
        [Resize(40, shorter_side=True), RandomCrop(32), HorizontalFlip(), RandAugment()]
    )
    spec = LoaderSpec(
        sets["recordio"],
        batch_size=8,
        transforms=chain,
        shuffle=True,
        seed=3,
        workers=2,  # a batch in two chunks: the pairs stay within one
        options={"mix": MixUpCutMix(num_classes=3)},
    )
    r = check_resume(spec, kills=2, world_size=1, epochs=2)
    assert r.passed, str(r)
    assert len(r.kills) == 2 and r.samples == 2 * 48
