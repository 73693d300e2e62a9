"""`geosharp symmetries`: what was found, bound and refused in a saved model, as text and JSON, checked
against the symmetry map built directly."""
import json

from geosharp_ref.cli import main
from geosharp_ref.symmetry import symmetry_map
from tests import cases


def test_symmetries_lists_bound_and_refused_pairs(tmp_path, capsys):
    model = cases.llama()  # rotary embeddings: Q/K refused, V/O bound
    model.save_pretrained(tmp_path / "llama")
    out = tmp_path / "s.json"
    capsys.readouterr()
    assert main(["symmetries", str(tmp_path / "llama"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    smap = symmetry_map(model)
    doc = json.loads(out.read_text())
    assert [g["key"] for g in doc["groups"]] == [g.key for g in smap.groups]
    assert {g["kind"] for g in doc["groups"]} == {"vo"}
    assert [r["key"] for r in doc["refused"]] == [k for k, _ in smap.refused] and doc["refused"]
    assert all("rotary" in r["reason"] for r in doc["refused"])
    assert f"bound: {len(smap.groups)} GL(h) groups" in text and "refused" in text


def test_symmetries_of_a_missing_directory_is_one_error_line(tmp_path, capsys):
    assert main(["symmetries", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("geosharp: error: ")
