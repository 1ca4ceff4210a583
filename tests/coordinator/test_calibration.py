"""Calibration files: whatever is on disk, a bad file is ignored (re-measured), never a crash."""
import pytest

from triforce.coordinator.calibration import CalibrationFile


@pytest.mark.parametrize("content", [b"\xff\xfe\x00", b'{"k": ', b"", b"[]", b"null", b'{"costs": {"a": 1}}'])
def test_a_calibration_file_of_any_bytes_is_read_or_ignored(tmp_path, content):
    """Bytes that are not UTF-8 broke every run with a UnicodeDecodeError."""
    path = tmp_path / "costs-2.json"
    path.write_bytes(content)
    entries = CalibrationFile(path).entries
    assert entries == ({"costs": {"a": 1}} if content.startswith(b'{"costs"') else {})


def test_entries_of_the_wrong_shape_are_dropped_and_the_rest_kept(tmp_path, caplog):
    """JSON of the wrong shape inside the object (a hand edit, another version's file) broke every auto
    request with a traceback until the file was deleted: a list or a number for a cost entry, strings or
    nulls for seconds, a context that is not a number, an acceptance of 7."""
    import json

    from triforce.coordinator.costs import CostTable
    from triforce.coordinator.priors import Priors

    good_cost, good_prior = {"1": 0.012, "4": 0.02}, {"acceptance": {"draft": 0.6}, "realized": {"ar": 1.0},
                                                      "overhead": {"draft/round": 0.001}}
    costs = {"cpu||t||4096": good_cost, "cpu||a||4096": [1, 2], "cpu||b||4096": 5, "cpu||c||4096": {"1": "x"},
             "cpu||d||4096": {"1": None}, "cpu||e||latest": good_cost, "cpu||f||4096": {"1": -1.0},
             "cpu||g||4096": {"one": 0.1}}
    priors = {"good": good_prior, "list": [1], "words": {"acceptance": {"draft": "high"}},
              "past one": {"acceptance": {"draft": 7.0}}, "negative": {"realized": {"ar": -3}},
              "other part": {"speed": {}}}
    for cls, entries, good in ((CostTable, costs, {"cpu||t||4096": good_cost}), (Priors, priors, {"good": good_prior})):
        path = tmp_path / cls.filename
        path.write_text(json.dumps(entries).replace("-1.0", "NaN") if cls is CostTable else json.dumps(entries))
        caplog.clear()
        assert cls(path).entries == good
        assert f"ignoring {len(entries) - 1} malformed entries" in caplog.text


def test_a_file_that_cannot_be_saved_warns_once_and_leaves_nothing_behind(tmp_path, caplog):
    path = tmp_path / "costs-2.json"
    path.mkdir()  # a folder where the file goes
    table = CalibrationFile(path)
    table.entries["k"] = {"1": 0.1}
    for _ in range(3):
        table.save()
    assert caplog.text.count("cannot save") == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["costs-2.json"]
