"""The listing: classes, allow-list, symlinks, odd names (faults.md B1 #2, #11, #12, #15, #16)."""

from __future__ import annotations

import os
import time

from hypothesis import given, settings
from hypothesis import strategies as st
from packhelp import image_bytes, make_tree, write

from stoker.pack.plan.scan import escape_name, read_lst, scan_folder, unescape_name


def test_classes_sorted_and_junk_ignored(tmp_path):  # B1 #2
    make_tree(str(tmp_path), {"b": 2, "a": 1, "c": 1})
    for junk in ("a/.DS_Store", "b/Thumbs.db", "c/notes.txt"):
        write(str(tmp_path / junk), b"junk")
    write(str(tmp_path / "a" / "UPPER.JPEG"), image_bytes())
    res = scan_folder(tmp_path)
    assert res.classes == {"a": 0, "b": 1, "c": 2}
    assert [it.rel for it in res.items] == [
        "a/UPPER.JPEG",
        "a/img000.jpg",
        "b/img000.jpg",
        "b/img001.jpg",
        "c/img000.jpg",
    ]
    assert [it.label for it in res.items] == [0, 0, 1, 1, 2]
    assert res.ignored == 3 and res.found == 8 and not res.rejects


def test_nested_folders_belong_to_their_top_class(tmp_path):
    write(str(tmp_path / "a" / "x" / "y" / "deep.jpg"), image_bytes())
    write(str(tmp_path / "b" / "top.png"), image_bytes(fmt="PNG"))
    res = scan_folder(tmp_path)
    assert [(it.rel, it.label) for it in res.items] == [("a/x/y/deep.jpg", 0), ("b/top.png", 1)]


def test_flat_folder_gets_label_zero_else_loose_files_ignored(tmp_path):
    write(str(tmp_path / "flat" / "one.jpg"), image_bytes())
    res = scan_folder(tmp_path / "flat")
    assert res.classes == {} and [it.label for it in res.items] == [0]
    make_tree(str(tmp_path / "flat"), {"cls": 1})
    res = scan_folder(tmp_path / "flat")
    assert [it.rel for it in res.items] == ["cls/img000.jpg"] and res.unclassified == 1


def test_empty_class_keeps_its_id(tmp_path):  # B1 #16
    make_tree(str(tmp_path / "with"), {"a": 1, "c": 1})
    os.makedirs(tmp_path / "with" / "b")
    res = scan_folder(tmp_path / "with")
    assert res.classes == {"a": 0, "b": 1, "c": 2}
    assert [it.label for it in res.items] == [0, 2]


def test_symlink_loop_terminates(tmp_path):  # B1 #11
    make_tree(str(tmp_path), {"a": 2})
    os.symlink("..", tmp_path / "a" / "loop")
    os.symlink(".", tmp_path / "a" / "self")
    for follow in (False, True):
        t0 = time.perf_counter()
        res = scan_folder(tmp_path, follow_symlinks=follow)
        assert time.perf_counter() - t0 < 5
        rels = [it.rel for it in res.items]
        assert sorted(rels) == ["a/img000.jpg", "a/img001.jpg"], rels
        assert len({os.path.realpath(it.path) for it in res.items}) == len(rels)


def test_dangling_and_escaping_links_rejected(tmp_path):  # B1 #12
    root = tmp_path / "root"
    make_tree(str(root), {"a": 1})
    secret = write(str(tmp_path / "outside.jpg"), image_bytes())
    os.symlink(secret, root / "a" / "escape.jpg")
    os.symlink(str(tmp_path / "gone.jpg"), root / "a" / "dangling.jpg")
    os.symlink("img000.jpg", root / "a" / "inside.jpg")
    res = scan_folder(root)
    assert sorted(it.rel for it in res.items) == ["a/img000.jpg", "a/inside.jpg"]
    reasons = {rel: reason for rel, reason, _ in res.rejects}
    assert reasons == {"a/escape.jpg": "outside_root", "a/dangling.jpg": "broken_link"}
    assert res.found == 4


def test_symlinked_folder_followed_only_when_asked(tmp_path):
    make_tree(str(tmp_path / "real"), {"a": 2})
    root = tmp_path / "root"
    os.makedirs(root)
    os.symlink(tmp_path / "real" / "a", root / "a")
    res = scan_folder(root)
    assert res.items == [] and res.ignored_links == 1 and res.ignored == 1
    res = scan_folder(root, follow_symlinks=True)
    assert [it.rel for it in res.items] == ["a/img000.jpg", "a/img001.jpg"]


def test_fifo_is_rejected_not_read(tmp_path):
    make_tree(str(tmp_path), {"a": 1})
    os.mkfifo(tmp_path / "a" / "pipe.jpg")
    res = scan_folder(tmp_path)
    assert [r[:2] for r in res.rejects] == [("a/pipe.jpg", "not_a_file")]


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\t\n\r\\\udce9\udcff")))
def test_escape_round_trip(name):  # B1 #15: names never break a TSV line
    text = escape_name(name)
    assert "\t" not in text and "\n" not in text and "\r" not in text
    text.encode("utf-8")  # always writable as UTF-8
    assert unescape_name(text) == name


def test_odd_names_listed_exactly(tmp_path):  # B1 #15
    cls = os.fsencode(tmp_path) + b"/cl\xe9"
    os.makedirs(cls)
    for name in (b"a\tb\n.jpg", b"caf\xe9.jpg", b"back\\slash.jpg"):
        with open(cls + b"/" + name, "wb") as f:
            f.write(image_bytes())
    res = scan_folder(tmp_path)
    assert [os.fsencode(n) for n in res.classes] == [b"cl\xe9"]
    assert sorted(os.fsencode(it.rel) for it in res.items) == sorted(
        [b"cl\xe9/a\tb\n.jpg", b"cl\xe9/caf\xe9.jpg", b"cl\xe9/back\\slash.jpg"]
    )


def test_read_lst(tmp_path):
    write(str(tmp_path / "imgs" / "x.jpg"), image_bytes())
    write(str(tmp_path / "imgs" / "y.jpg"), image_bytes())
    lst = tmp_path / "list.lst"
    lst.write_bytes(b"7\t3.000000\timgs/x.jpg\n9\t1\t2\timgs/y.jpg\r\n\n")
    res = read_lst(lst)
    assert [(it.key, it.label, it.rel) for it in res.items] == [
        (7, 3.0, "imgs/x.jpg"),
        (9, (1.0, 2.0), "imgs/y.jpg"),
    ]
    assert res.items[0].path == os.path.join(str(tmp_path), "imgs/x.jpg")


def test_read_lst_errors_name_the_line(tmp_path):
    import pytest

    from stoker._core.errors import PackError

    lst = tmp_path / "bad.lst"
    lst.write_bytes(b"0\t0\ta.jpg\n0\t1\tb.jpg\n")
    with pytest.raises(PackError, match=r"line 2: index 0 appears twice"):
        read_lst(lst)
    lst.write_bytes(b"0\ta.jpg\n")
    with pytest.raises(PackError, match="line 1"):
        read_lst(lst)


def test_read_lst_confined_to_root(tmp_path):
    root = tmp_path / "root"
    write(str(root / "ok.jpg"), image_bytes())
    secret = write(str(tmp_path / "secret.jpg"), image_bytes())
    os.symlink(secret, root / "link.jpg")
    os.symlink(tmp_path, root / "up")  # a folder link leading out
    os.symlink(root / "gone.jpg", root / "dangling.jpg")
    lst = tmp_path / "list.lst"
    lines = ["0\t0\tok.jpg", "1\t0\t../secret.jpg", f"2\t0\t{secret}", "3\t0\tlink.jpg"]
    lines += ["4\t0\tup/secret.jpg", "5\t0\tnever.jpg", "6\t0\tdangling.jpg"]
    lines += ["7\t0\tsub/../ok.jpg"]
    lst.write_text("\n".join(lines) + "\n")
    res = read_lst(lst, root=root)
    assert [it.key for it in res.items] == [0]  # sub/ does not exist: missing below
    assert res.found == 8
    assert [(rel, why) for rel, why, _ in res.rejects] == [
        ("../secret.jpg", "outside_root"),
        (secret, "outside_root"),
        ("link.jpg", "outside_root"),
        ("up/secret.jpg", "outside_root"),
        ("never.jpg", "missing"),
        ("dangling.jpg", "broken_link"),
        ("sub/../ok.jpg", "missing"),
    ]
    res = read_lst(lst, root=root, allow_outside_root=True)
    assert [it.key for it in res.items] == [0, 1, 2, 3, 4]
    assert [why for _, why, _ in res.rejects] == ["missing", "broken_link", "missing"]
