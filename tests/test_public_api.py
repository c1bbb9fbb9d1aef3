"""The public surface: a sorted, importable __all__, and a cheap `import stoker`."""

from __future__ import annotations

import subprocess
import sys

import stoker


def test_all_is_sorted_and_unique():
    assert list(stoker.__all__) == sorted(set(stoker.__all__))


def test_every_exported_name_resolves():
    for name in stoker.__all__:
        assert getattr(stoker, name) is not None, name


def test_import_stoker_imports_no_framework_and_no_cv2():
    code = (
        "import sys, stoker; "
        "bad = [m for m in ('torch', 'keras', 'tensorflow', 'cv2') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import stoker pulled in: {out.stdout.strip()}"


def test_reading_a_local_set_imports_no_storage_client(tmp_path):
    folder = stoker.make_sample_data(tmp_path / "imgs", classes=2, per_class=3, size=32)
    stoker.pack(folder, tmp_path / "set" / "train", workers=1, progress=False)
    code = (
        "import sys, stoker; "
        f"ld = stoker.Loader({str(tmp_path / 'set' / 'train.stoker.json')!r}, batch_size=2, "
        "workers=0); "
        "n = sum(len(b.keys) for b in ld); ld.close(); "
        "bad = [m for m in ('fsspec', 's3fs', 'aiohttp', 'stoker.storage.remote', "
        "'stoker.storage.cache') if m in sys.modules]; "
        "print(n, ','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["6"], f"a local read pulled in: {out.stdout.strip()}"


def test_cli_help_lists_commands():
    out = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "stoker" in out.stdout


def test_stoker_pack_stays_callable_after_its_submodules_are_imported(tmp_path):
    import stoker.pack.packer  # noqa: F401  - binds the package to the name stoker.pack

    folder = stoker.make_sample_data(tmp_path / "imgs", classes=2, per_class=3, size=32)
    report = stoker.pack(folder, tmp_path / "out", workers=1, progress=False)
    assert report.written == 6
    assert callable(stoker.pack)
