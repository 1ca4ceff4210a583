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
              "--budget", "32", "--chunk-size", "4", "--sinks", "2", "--window", "16", "--json", "--device", "cpu", "--mode", "triforce"]
    assert main(common) == 0
    single = json.loads(capfd.readouterr().out)
    assert main(common + ["--workers", "2", "--control-port", str(free_port()), "--worker-device", "cpu"]) == 0
    out = capfd.readouterr().out
    distributed = json.loads(out.strip().splitlines()[-1])
    assert distributed["token_ids"] == single["token_ids"] and distributed["mode"] == "triforce"
    metrics = distributed["metrics"]
    assert metrics["control_messages"] > 0 and metrics["control_bytes_per_token"] > 0
    assert metrics["bulk_bytes"] > 0  # the retrieval cache's KV came over the torch.distributed link


def test_the_entry_refuses_to_run_outside_torchrun(monkeypatch, capsys):
    from triforce.launch.distributed import main as entry

    monkeypatch.delenv("RANK", raising=False)
    assert entry(["--prompt", "x"]) == 2
    assert "torchrun" in capsys.readouterr().err


def test_dynamic_retrieval_with_workers_is_a_one_line_error(folders, capfd):
    target, draft = folders
    argv = ["generate", "--model", str(target), "--draft", str(draft), "--prompt", "w3 w4", "--workers", "2",
            "--retrieval-policy", "dynamic", "--device", "cpu", "--worker-device", "cpu"]
    assert main(argv) == 2
    err = capfd.readouterr().err
    assert err.startswith("triforce: error: --retrieval-policy dynamic") and err.count("\n") == 1
    from argparse import Namespace

    from triforce.launch.distributed import check_distributed_settings

    check_distributed_settings(Namespace(retrieval_policy="dynamic", mode="ar"))  # no retrieval tier: no error


def test_groups_get_timeouts_and_each_rank_its_gpu_before_nccl_starts(monkeypatch):
    """What CUDA machines need, checked on the calls torch.distributed receives."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from triforce.launch.distributed import GroupTimeouts, init_groups

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend, kw)))
    monkeypatch.setattr(dist, "new_group", lambda ranks=None, **kw: calls.append(("group", ranks, kw)) or len(calls))
    groups = init_groups(2, 4, 1, True, GroupTimeouts(link_s=7.0, workers_s=90.0, startup_s=600.0))
    assert calls[0] == ("set_device", 1)
    kind, backend, kw = calls[1]
    assert (kind, backend) == ("init", "cpu:gloo,cuda:nccl") and kw["timeout"] == timedelta(seconds=600)
    assert kw["rank"] == 2 and kw["world_size"] == 4
    by_ranks = {tuple(ranks) if ranks else None: kw for kind, ranks, kw in calls[2:]}
    assert by_ranks[(1, 2, 3)]["timeout"] == timedelta(seconds=90)  # the worker group: NCCL's watchdog too
    assert by_ranks[(0, 1)] == {"backend": "gloo", "timeout": timedelta(seconds=7)}  # the bulk link
    assert groups.workers is not None and groups.link is not None
    calls.clear()
    init_groups(0, 3, 0, False, GroupTimeouts(link_s=7.0))
    assert [c[0] for c in calls] == ["init", "group", "group", "group"] and calls[0][1] == "gloo"
