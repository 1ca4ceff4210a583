"""Calibration files: whatever is on disk, a bad file is ignored (re-measured), never a crash."""
import pytest

from triforce.coordinator.calibration import CalibrationFile


@pytest.mark.parametrize("content", [b"\xff\xfe\x00", b'{"k": ', b"", b"[]", b"null", b'{"costs": {"a": 1}}'])
def test_a_calibration_file_of_any_bytes_is_read_or_ignored(tmp_path, content):
    """Bytes that are not UTF-8 broke every run with a UnicodeDecodeError."""
    path = tmp_path / "costs-3.json"
    path.write_bytes(content)
    entries = CalibrationFile(path).entries
    assert entries == ({"costs": {"a": 1}} if content.startswith(b'{"costs"') else {})


def test_entries_of_the_wrong_shape_are_dropped_and_the_rest_kept(tmp_path, caplog):
    """JSON of the wrong shape inside the object (a hand edit, another version's file) broke every auto
    request with a traceback until the file was deleted: a list or a number for a cost entry, strings or
    nulls for seconds, a context that is not a number, an acceptance of 7. A superscript digit passed
    str.isdigit, then int() refused it: a ValueError in every auto request."""
    import json

    from triforce.coordinator.costs import CostTable
    from triforce.coordinator.priors import Priors

    good_cost, good_prior = {"1": 0.012, "4": 0.02}, {"acceptance": {"draft": 0.6}, "realized": {"ar": 1.0},
                                                      "overhead": {"draft/round": 0.001}}
    costs = {"cpu||t||4096": good_cost, "cpu||a||4096": [1, 2], "cpu||b||4096": 5, "cpu||c||4096": {"1": "x"},
             "cpu||d||4096": {"1": None}, "cpu||e||latest": good_cost, "cpu||f||4096": {"1": -1.0},
             "cpu||g||4096": {"one": 0.1}, "cpu||h||4²": good_cost, "cpu||i||4096": {"²": 0.1}}
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
    path = tmp_path / "costs-3.json"
    path.mkdir()  # a folder where the file goes
    table = CalibrationFile(path)
    table.entries["k"] = {"1": 0.1}
    for _ in range(3):
        table.save("k")
    assert caplog.text.count("cannot save") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["costs-3.json", "costs-3.json.lock"]  # no partial file


def test_processes_sharing_a_file_keep_each_others_entries_and_drops(tmp_path):
    """Two processes (two tables on one path, each read at its start) that save in turn: each keeps the
    other's new entries and learns them, a changed entry is the latest saver's, and an entry one dropped
    stays dropped when the other, which still holds it, saves something else. (Each wrote the whole of
    what it read at its start: a long-lived server wiped what a bench measured meanwhile.)"""
    import json

    path = tmp_path / "costs-3.json"
    path.write_text(json.dumps({"old": {"1": 1.0}, "shared": {"1": 2.0}}))
    server, bench = CalibrationFile(path), CalibrationFile(path)
    bench.entries["bench"] = {"1": 3.0}
    bench.save("bench")
    server.entries["server"] = {"1": 4.0}
    server.save("server")
    on_disk = json.loads(path.read_text())
    assert on_disk == {"old": {"1": 1.0}, "shared": {"1": 2.0}, "bench": {"1": 3.0}, "server": {"1": 4.0}}
    assert server.entries == on_disk  # learned the bench's entry
    del bench.entries["old"]
    bench.save("old")  # stale: dropped
    server.entries["shared"] = {"1": 5.0}
    server.save("shared")  # still held "old": it does not come back
    on_disk = json.loads(path.read_text())
    assert "old" not in on_disk and "old" not in server.entries and on_disk["shared"] == {"1": 5.0}
    bench.entries["other"] = {"1": 6.0}
    bench.save("other")
    assert json.loads(path.read_text())["shared"] == {"1": 5.0} == bench.entries["shared"]  # the latest save's


def test_saves_of_processes_running_at_once_lose_nothing(tmp_path):
    """Four processes each saving 25 entries of their own into one file at once: all 100 are there (the
    lock orders each read-merge-write)."""
    import json
    import subprocess
    import sys

    path = tmp_path / "costs-3.json"
    script = (f"import sys; from pathlib import Path; from triforce.coordinator.calibration import CalibrationFile\n"
              f"t = CalibrationFile(Path({str(path)!r}))\n"
              f"for i in range(25):\n"
              f"    t.entries[f'{{sys.argv[1]}}-{{i}}'] = {{'1': 0.5}}; t.save(f'{{sys.argv[1]}}-{{i}}')\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(p)]) for p in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert len(json.loads(path.read_text())) == 100


def test_cost_entries_keep_the_sizes_each_process_measured(tmp_path):
    """A server and a bench that measure different sizes of one cost entry keep both (whole entries
    replaced each other: a later save lost the sizes another process had measured meanwhile)."""
    import json

    from triforce.coordinator.costs import CostTable

    path = tmp_path / CostTable.filename
    key = "cpu||target||4096"
    path.write_text(json.dumps({key: {"1": 0.01, "2": 0.02}}))
    server, bench = CostTable(path), CostTable(path)
    bench.entries[key].update({"4": 0.03, "8": 0.05})
    bench.save(key)
    server.entries[key].update({"16": 0.09, "1": 0.011})
    server.save(key)
    assert json.loads(path.read_text())[key] == {"1": 0.011, "2": 0.02, "4": 0.03, "8": 0.05, "16": 0.09}
    assert server.entries[key]["8"] == 0.05


def test_a_cost_save_writes_back_only_the_sizes_it_measured(tmp_path, monkeypatch):
    """A process that holds an older read of an entry another process measured again (after `forget`), and
    measures a size of its own, writes back that size, not its stale timings of the others over the fresh
    ones."""
    import json

    import triforce.coordinator.costs as costs_module
    from triforce.coordinator.costs import CostTable

    path = tmp_path / CostTable.filename
    key = "cpu||target||4096"
    path.write_text(json.dumps({key: {"1": 0.01, "2": 0.02}}))
    server, bench = CostTable(path), CostTable(path)
    bench.entries[key] = {"1": 0.05, "2": 0.06}  # measured again
    bench.save(key)
    monkeypatch.setattr(CostTable, "entry_key", lambda self, tier, batch=1: key)
    monkeypatch.setattr(costs_module, "forward_seconds", lambda tiers, sizes: dict.fromkeys(sizes, 0.07))
    assert server.seconds([object()], (1, 4), batch=1) == {1: 0.01, 4: 0.07}  # what it held, and measured
    assert json.loads(path.read_text())[key] == {"1": 0.05, "2": 0.06, "4": 0.07}
    assert server.entries[key]["2"] == 0.06  # and it learned the fresh ones
    # An entry a process measured first (its save merged nothing) and another measured again after
    other = "cpu||draft||4096"
    monkeypatch.setattr(CostTable, "entry_key", lambda self, tier, batch=1: other)
    server.seconds([object()], (1, 2), batch=1)  # the file had no such entry
    bench = CostTable(path)
    bench.entries[other] = {"1": 0.5, "2": 0.6}
    bench.save(other)
    server.seconds([object()], (1, 2, 8), batch=1)
    assert json.loads(path.read_text())[other] == {"1": 0.5, "2": 0.6, "8": 0.07}


def test_no_home_is_one_line_for_models_and_memory_only_for_calibrations(monkeypatch, caplog):
    """HOME unset and a user without a home (a container run as an arbitrary id): Path.home() raised
    RuntimeError, a traceback out of --mode auto's first plan and every fetch."""
    import logging
    from pathlib import Path

    from triforce.coordinator import calibration
    from triforce.models.config import ModelLoadError
    from triforce.models.folders import triforce_home

    monkeypatch.delenv("TRIFORCE_HOME", raising=False)
    monkeypatch.delenv("TRIFORCE_CALIBRATION", raising=False)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(RuntimeError("no home"))))
    monkeypatch.setattr(calibration, "_SAID_NO_HOME", [])
    with pytest.raises(ModelLoadError, match="set TRIFORCE_HOME"):
        triforce_home()
    with caplog.at_level(logging.WARNING):
        assert calibration.calibration_folder() is None
    assert "calibration kept in memory only" in caplog.text


def test_a_damaged_cached_file_is_made_again_not_a_traceback(tmp_path, capsys, monkeypatch):
    """train-draft's checkpoints and cached data were renamed into place unsynced: after a host failed, one
    could be empty or cut, and every rerun failed on it with a traceback. They are synced first now (a lost
    checkpoint was hours of training), and a damaged one (cut elsewhere) is still made again."""
    import os

    import torch

    from triforce.errors import UserError
    from triforce.files import load_cached, save_whole

    path, synced, fsync = tmp_path / "checkpoint.pt", [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd)))
    save_whole(path, {"step": 3})
    assert synced and synced[0].endswith(".partial")  # on the disk before its rename
    from triforce.files import write_whole  # (a calibration, which requests save as they end, waits on no disk)
    write_whole(tmp_path / "costs.json", "{}")
    assert len(synced) == 1
    assert load_cached(path) == {"step": 3} and load_cached(tmp_path / "none.pt") is None
    path.write_bytes(path.read_bytes()[:20])  # cut
    assert load_cached(path) is None and not path.exists()
    err = capsys.readouterr().err
    assert f"cannot read {path}" in err and "it is made again" in err
    save_whole(path, {"step": 4})
    path.write_bytes(path.read_bytes() + b"\0" * 4096)  # ending in zeros: torch's reader says EINVAL, damage
    assert load_cached(path) is None and not path.exists()
    save_whole(path, {"step": 4})  # one the system cannot read (an I/O error): said, and kept (hours of a
    monkeypatch.setattr(torch, "load", lambda *a, **k: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    with pytest.raises(UserError, match="Input/output error"):  # draft's training were removed so)
        load_cached(path)
    assert path.exists()


def test_models_that_differ_only_in_head_width_keep_apart_costs():
    """A tier's cost entry is keyed by its model's shape: two models alike but for head_dim (set apart from
    hidden_size / num_heads, as Qwen3's and Gemma's are) shared one, and the second was planned with the
    first's forward times."""
    from dataclasses import replace
    from types import SimpleNamespace

    import torch

    from triforce.coordinator.costs import tier_key
    from triforce.models.config import ModelConfig

    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)
    keys = {tier_key(SimpleNamespace(name="target", placement="local", model=SimpleNamespace(
        config=config, dtype=torch.float32, device=torch.device("cpu")))) for config in (cfg, replace(cfg, head_dim=16))}
    assert len(keys) == 2
