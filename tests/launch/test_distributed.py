"""`triforce generate --workers W` (torchrun, gloo, loopback) prints what the single-process run prints."""
import json
import socket

import pytest

from triforce.launch.cli import main


@pytest.fixture(scope="module")
def folders(tiny_dir):
    spec = dict(hidden_size=48, num_heads=12, num_kv_heads=6, num_layers=2, scale=25, tokenizer=True)
    return tiny_dir("dist-target", seed=80, **spec), tiny_dir("dist-draft", seed=81, num_layers=1, scale=25)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_workers_flag_matches_the_single_process_run(folders, capfd):
    target, draft = folders
    common = ["generate", "--model", str(target), "--draft", str(draft), "--prompt", " ".join(f"w{i}" for i in
              range(3, 90)), "--max-new-tokens", "24", "--temperature", "0", "--ignore-eos", "--dtype", "float32",
              "--budget", "32", "--chunk-size", "4", "--sinks", "2", "--window", "16", "--json", "--device", "cpu"]
    assert main(common) == 0
    single = json.loads(capfd.readouterr().out)
    assert main(common + ["--workers", "2", "--control-port", str(free_port()), "--worker-device", "cpu"]) == 0
    out = capfd.readouterr().out
    distributed = json.loads(out.strip().splitlines()[-1])
    assert distributed["token_ids"] == single["token_ids"] and distributed["mode"] == "triforce"
    metrics = distributed["metrics"]
    assert metrics["control_messages"] > 0 and metrics["control_bytes_per_token"] > 0


def test_the_entry_refuses_to_run_outside_torchrun(monkeypatch, capsys):
    from triforce.launch.distributed import main as entry

    monkeypatch.delenv("RANK", raising=False)
    assert entry(["--prompt", "x"]) == 2
    assert "torchrun" in capsys.readouterr().err
