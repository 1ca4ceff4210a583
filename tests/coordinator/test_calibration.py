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
