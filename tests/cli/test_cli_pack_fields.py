"""`stoker pack LISTING OUT` (``.jsonl``/``.csv``, ``--schema``), then `stoker inspect` and
`stoker verify` of the set with fields; what the CLI packs reads back as the listing says."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from stoker._core.schema import Field, Schema
from stoker.cli import main
from stoker.formats.recordio.seam import RecordIOReader
from stoker.loader.sources.records import RecordSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pack"))
from packhelp import image_bytes, write  # noqa: E402

ARGS = ["--workers", "1", "--quiet"]


def _listing(root: Path, n: int = 5) -> list[dict]:
    rows = []
    for i in range(n):
        write(str(root / f"{i}.jpg"), image_bytes((20, 16), seed=i))
        mask = Image.fromarray(np.full((16, 20), i, np.uint8), "L")
        buf = io.BytesIO()
        mask.save(buf, "PNG")
        write(str(root / f"{i}_mask.png"), buf.getvalue())
        rows.append(
            {
                "image": f"{i}.jpg",
                "label": i % 2,
                "boxes": [[0, 0, 5, 5 + j] for j in range(i % 3)],
                "text": f"line {i}",
                "mask": f"{i}_mask.png",
            }
        )
    return rows


def test_cli_packs_a_jsonl_listing_and_inspect_shows_its_fields(tmp_path, capsys) -> None:
    rows = _listing(tmp_path)
    listing = tmp_path / "train.jsonl"
    listing.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = str(tmp_path / "set")
    assert main(["pack", str(listing), out, *ARGS]) == 0
    with RecordIOReader(out + ".stoker.json") as r:
        assert list(r.schema) == ["image", "label", "boxes", "text", "mask"]
        assert r.schema["boxes"] == Field.boxes(max_len=2)
        read = r.reader(None, ("boxes", "text", "mask"))
        for i, row in enumerate(rows):
            image, label, _key, fields = read(i)
            assert bytes(image) == (tmp_path / row["image"]).read_bytes()
            assert label == row["label"]
            np.testing.assert_array_equal(fields["boxes"], np.reshape(row["boxes"], (-1, 4)))
            assert fields["text"] == row["text"]
            assert fields["mask"] == (tmp_path / row["mask"]).read_bytes()
    src = RecordSource(out + ".stoker.json")
    _, label, _, got = src.reader(None, ("text",))(3)
    assert (label, got) == (1, {"text": "line 3"})
    src.close()
    capsys.readouterr()
    assert main(["inspect", out + ".stoker.json"]) == 0
    text = capsys.readouterr().out
    assert "fields:" in text and "boxes" in text and "geometry boxes, at most 2 rows" in text
    assert main(["inspect", out + ".stoker.json", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [f["name"] for f in info["schema"]] == ["image", "label", "boxes", "text", "mask"]
    assert main(["verify", out + ".stoker.json", "--decode"]) == 0


def test_cli_csv_with_a_schema_file(tmp_path, capsys) -> None:
    rows = _listing(tmp_path, 3)
    lines = ["image,label,boxes,text,mask"]
    for r in rows:
        boxes = json.dumps(r["boxes"]).replace('"', '""')
        lines.append(f'{r["image"]},{r["label"]},"{boxes}",{r["text"]},{r["mask"]}')
    listing = tmp_path / "train.csv"
    listing.write_text("\n".join(lines) + "\n")
    schema = Schema(
        {
            "image": Field.image(),
            "label": Field.numeric((), "int64", header=True),
            "boxes": Field.ragged((4,), "int32"),  # plain rows of ints, not geometry
            "text": Field.text(),
        }
    )
    schema_path = tmp_path / "schema.json"
    schema_path.write_text(json.dumps(schema.to_json()))
    out = str(tmp_path / "set")
    assert main(["pack", str(listing), out, "--schema", str(schema_path), *ARGS]) == 0
    with RecordIOReader(out + ".stoker.json") as r:
        assert r.schema == schema.with_max_len({"boxes": 2, "text": 6})
        got = r.reader(None, ("boxes", "text"))(2)[3]
        assert got["boxes"].dtype == np.int32 and got["boxes"].tolist() == rows[2]["boxes"]
        assert set(got) == {"boxes", "text"}  # the mask column is not in the schema


def test_cli_names_the_line_of_a_bad_row_and_fails_past_max_rejects(tmp_path, capsys) -> None:
    rows = _listing(tmp_path, 5)
    rows[1]["boxes"] = [[1, 2]]  # the other rows with boxes have 4 numbers a row
    listing = tmp_path / "train.jsonl"
    listing.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = str(tmp_path / "set")
    assert main(["pack", str(listing), out, "--max-rejects", "0", *ARGS]) == 1
    err = capsys.readouterr().err
    assert "1 listing rows rejected" in err
    rejects = Path(out + ".rejects.tsv").read_text()
    assert "line 2, field 'boxes': expects shape (n, 4), got (1, 2)" in rejects
