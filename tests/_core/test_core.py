"""The L0 pieces every room relies on: error messages, specs, atomic writes, seeds."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from stoker._core.atomic import atomic_write, partial_path, write_bytes_atomic
from stoker._core.errors import (
    ChildTraceback,
    CorruptRecordError,
    IndexFormatError,
    SpecError,
    StokerError,
    StokerFormatError,
    WorkerError,
)
from stoker._core.seeding import SampleRngs, fresh_seed, sample_rng, stream_rng
from stoker._core.specs import ArraySpec


def test_corrupt_record_error_names_file_key_offset_and_line():
    e = CorruptRecordError("/data/train.rec", 4096, "bad magic 0xdeadbeef", key=17, idx_line=18)
    msg = str(e)
    for part in ("/data/train.rec", "key 17", "byte offset 4096", ".idx line 18", "bad magic"):
        assert part in msg
    assert isinstance(e, StokerFormatError) and isinstance(e, ValueError)
    assert isinstance(e, StokerError)


def test_errors_survive_pickling_between_processes():
    e = CorruptRecordError("a.rec", 8, "truncated", key=3)
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.path, e2.offset, e2.key, e2.reason) == ("a.rec", 8, 3, "truncated")
    i = pickle.loads(pickle.dumps(IndexFormatError("a.idx", 7, "missing tab")))
    assert "line 7" in str(i)


def test_worker_error_carries_remote_traceback_as_its_cause():
    """The message stays one line; the worker's traceback is the ``__cause__`` Python prints
    above it (issue 43: a child's failure reaches the user as its one-line cause)."""
    e = WorkerError(
        "boom", exc_type="KeyError", worker_id=1, key=5, remote_traceback="Traceback ..."
    )
    assert str(e) == "boom" and e.remote_traceback == "Traceback ..."
    assert isinstance(e.__cause__, ChildTraceback) and "Traceback ..." in str(e.__cause__)
    assert e.worker_id == 1 and e.key == 5


def test_array_spec_checks_shape_and_dtype():
    spec = ArraySpec((112, 112, 3), "uint8")
    assert spec.fixed and spec.nbytes == 112 * 112 * 3
    spec.check(np.zeros((112, 112, 3), np.uint8))
    with pytest.raises(
        SpecError, match=r"got \(112, 113, 3\) uint8, expected \(112, 112, 3\) uint8"
    ):
        spec.check(np.zeros((112, 113, 3), np.uint8), what="key 4")
    with pytest.raises(SpecError):
        spec.check(np.zeros((112, 112, 3), np.float32))
    loose = ArraySpec((None, None, 3))
    assert not loose.fixed and loose.accepts(np.zeros((5, 9, 3), np.uint8))
    with pytest.raises(SpecError):
        _ = loose.nbytes
    with pytest.raises(SpecError):
        ArraySpec((-1, 3))
    assert ArraySpec.from_json(spec.to_json()) == spec


def test_atomic_write_replaces_only_on_success(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as f:
            f.write(b"half")
            raise RuntimeError("killed midway")
    assert target.read_bytes() == b"old"
    assert not os.path.exists(partial_path(target))
    write_bytes_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert not os.path.exists(partial_path(target))


def test_atomic_write_refuses_read_mode(tmp_path):
    with pytest.raises(ValueError):
        with atomic_write(tmp_path / "x", "rb"):
            pass


def test_sample_rng_is_a_pure_function_of_seed_epoch_index():
    a = sample_rng(7, 1, 123).random(4)
    b = sample_rng(7, 1, 123).random(4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, sample_rng(7, 2, 123).random(4))
    assert not np.array_equal(a, sample_rng(7, 1, 124).random(4))
    assert not np.array_equal(a, sample_rng(8, 1, 123).random(4))
    # sample and stream domains are independent even for the same words
    assert not np.array_equal(sample_rng(7, 1, 123).random(4), stream_rng(7, 1, 123).random(4))


def test_sample_rngs_reset_to_each_samples_own_stream():
    rngs = SampleRngs(7, 1)
    for i in (0, 123, 5, 2**40, 123):
        g = rngs.at(i)
        g.integers(0, 10, 3)  # partly used: the next at() must not carry this over
        assert np.array_equal(rngs.at(i).random(9), sample_rng(7, 1, i).random(9))
    assert rngs.at(3) is rngs.at(4)  # one generator, re-keyed


@pytest.mark.parametrize(
    ("seed", "epoch"), [(0, 0), (7, 1), (2**64 - 1, 2**64 - 1), (2**127 + 5, 3)]
)
def test_first_blocks_are_the_first_four_draws_of_each_samples_stream(seed, epoch):
    """A worker takes a chunk's first draws from one computation for all its samples; they
    are the bits each sample's own generator gives, at the edges of the seed, epoch and
    index ranges too."""
    rngs = SampleRngs(seed, epoch)
    idx = np.concatenate(
        [
            [0, 1, 2**32 - 1, 2**32, 2**63 - 1],
            np.random.default_rng(seed % 97).integers(0, 2**40, 60),
        ]
    ).astype(np.int64)
    got = rngs.first_blocks(idx)
    want = np.array([sample_rng(seed, epoch, int(i)).random(4) for i in idx])
    assert got.shape == (len(idx), 4) and got.dtype == np.float64
    np.testing.assert_array_equal(got, want)
    # the generator it shares with at() is not moved
    np.testing.assert_array_equal(rngs.at(9).random(4), sample_rng(seed, epoch, 9).random(4))
    assert rngs.first_blocks(np.array([], np.int64)).shape == (0, 4)
    with pytest.raises(ValueError, match="non-negative"):
        rngs.first_blocks(np.array([3, -1]))


def test_sample_streams_do_not_overlap_between_neighbouring_indices():
    # a counter-based generator must not hand sample i+1 the continuation of sample i
    a = sample_rng(0, 0, 10).random(2000)
    b = sample_rng(0, 0, 11).random(20)
    assert not np.isin(b, a).any()


def test_sample_rng_refuses_negative_or_huge_words():
    with pytest.raises(ValueError, match="index"):
        sample_rng(0, 0, -1)
    with pytest.raises(ValueError, match="seed"):
        sample_rng(-5, 0, 0)
    with pytest.raises(ValueError, match="epoch"):
        sample_rng(0, 2**64, 0)


def test_fresh_seed_is_a_nonnegative_int_that_varies():
    seeds = {fresh_seed() for _ in range(8)}
    assert len(seeds) > 1 and all(0 <= s < 2**63 for s in seeds)


def test_atomic_write_refuses_to_replace_a_device_or_link(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="not a regular file"):
        write_bytes_atomic(link, b"x")
    with pytest.raises(ValueError, match="not a regular file"):
        write_bytes_atomic(os.devnull, b"x")
    assert os.path.islink(link)


def test_text_with_a_lone_surrogate_is_refused_naming_the_field():
    from stoker._core.errors import SpecError
    from stoker._core.schema import Field

    assert Field.text().check("caf\u00e9", name="caption") == "caf\u00e9"
    with pytest.raises(SpecError, match="caption.*lone surrogate at character 2"):
        Field.text().check("ab\ud800c", name="caption")


def test_crc32c_is_the_packages_function_without_its_metadata_import():
    # every loader worker server imports the CRC32C function before the first batch; the
    # crc32c package's __init__ reads its version from the installed metadata (over 100 ms in
    # a fresh interpreter), so stoker loads the compiled module alone, which a later
    # `import crc32c` then shares
    code = (
        "import sys\n"
        "from stoker._core.crc import crc32c\n"
        "assert 'importlib.metadata' not in sys.modules, 'metadata imported'\n"
        "assert 'crc32c' not in sys.modules, 'the package ran'\n"
        "assert crc32c(b'123456789') == 0xE3069283  # the CRC-32C check value\n"
        "assert crc32c(b'6789', value=crc32c(b'12345')) == 0xE3069283\n"
        "import crc32c as pkg\n"
        "assert pkg.crc32c is crc32c\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
