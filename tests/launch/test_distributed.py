"""`triforce generate --workers W` (torchrun, gloo, loopback) prints what the single-process run prints."""
import json

import pytest
import torch
from servers import free_port, wait_healthy

from triforce.errors import UserError
from triforce.launch.cli import main


@pytest.fixture(scope="module")
def folders(tiny_dir):
    spec = dict(hidden_size=48, num_heads=12, num_kv_heads=6, num_layers=2, scale=25, tokenizer=True)
    return tiny_dir("dist-target", seed=80, **spec), tiny_dir("dist-draft", seed=81, num_layers=1, scale=25, tokenizer=True)


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


def test_a_rank_parses_the_positional_model_as_the_launching_command_does():
    from triforce.launch.distributed import parse_command

    assert parse_command(["serve", "/tmp/some-model", "--port", "8000"]).model == "/tmp/some-model"


def test_the_entry_refuses_to_run_outside_torchrun(monkeypatch, capsys):
    from triforce.launch.distributed import main as entry

    monkeypatch.delenv("RANK", raising=False)
    assert entry(["--prompt", "x"]) == 2
    assert "torchrun" in capsys.readouterr().err
    assert entry(["serve", "some-model", "--model", "other"]) == 2  # a traceback on every rank
    err = capsys.readouterr().err
    assert err.startswith("triforce: error:") and "Traceback" not in err


def test_a_shard_that_does_not_fit_as_it_loads_is_a_one_line_error(monkeypatch):
    """A rank whose shard the device cannot hold said so in a traceback of its own (docs/distributed.md
    promises a line); and a run ended by a signal exits 128 + N, as a shell says it."""
    from triforce.launch.with_workers import exit_status
    from triforce.models.parallel import TensorParallel
    from triforce.workers import group

    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(group, "load_model", full)
    with pytest.raises(UserError, match="out of memory as it loaded its shard of the target on cuda:1"):
        group.run_worker("/nonexistent", "bfloat16", "cuda:1", TensorParallel(0, 1, None), None, None)
    assert [exit_status(code) for code in (-9, -15, 0, 2)] == [137, 143, 0, 2]


def test_the_groups_share_of_the_memory_is_the_flags():
    from argparse import Namespace

    from triforce.config import ConfigError
    from triforce.launch.distributed import _memory_share

    assert [_memory_share(Namespace(gpu_memory_utilization=v)) for v in (0.5, None)] == [0.5, 0.9]
    assert _memory_share(Namespace()) == 0.9
    with pytest.raises(ConfigError, match="gpu_memory_utilization must be in"):
        _memory_share(Namespace(gpu_memory_utilization=2))


def test_the_leader_tells_a_name_other_nodes_reach(monkeypatch):
    """--control-host auto: a node whose name sits on /etc/hosts' 127.0.0.1 line after localhost has
    getfqdn() 'localhost', which sent a coordinator on another node to its own loopback."""
    import socket

    from triforce.launch import distributed

    monkeypatch.setattr(distributed.dist, "broadcast", lambda *args, **kwargs: None)  # rank 1's own buffer
    monkeypatch.setattr(socket, "gethostname", lambda: "node7")
    for fqdn, told in (("localhost", "node7"), ("localhost.localdomain", "node7"), ("node7.cluster", "node7.cluster")):
        monkeypatch.setattr(socket, "getfqdn", lambda name="", fqdn=fqdn: fqdn)
        assert distributed._leader_host(1, None) == told


def test_dynamic_retrieval_with_workers_is_a_one_line_error(folders, capfd):
    target, draft = folders
    argv = ["generate", "--model", str(target), "--draft", str(draft), "--prompt", "w3 w4", "--workers", "2",
            "--retrieval-policy", "dynamic", "--device", "cpu", "--worker-device", "cpu"]
    assert main(argv) == 2
    err = capfd.readouterr().err
    assert err.startswith("triforce: error: --retrieval-policy dynamic") and err.count("\n") == 1
    from argparse import Namespace

    from triforce.launch.distributed_checks import check_distributed_settings

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


def test_a_group_the_node_or_the_model_cannot_hold_is_refused_by_every_rank_before_the_rendezvous(
        folders, monkeypatch, capsys):
    """Each rank takes cuda:LOCAL_RANK: four processes on a node of two GPUs failed in set_device on ranks 2
    and 3 while the others waited in the rendezvous. And under torchrun by hand a world whose workers do not
    split the model (the Slurm recipe's 8 processes: 7 workers) failed on every worker rank as it loaded."""
    import torch

    from triforce.launch.distributed import main as entry

    target, _ = folders  # 12 heads, 6 KV heads, MLP 128: 7 workers do not split it, 2 do
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr("triforce.launch.distributed.init_groups", lambda *a, **k: pytest.fail("rendezvous"))
    for world, local, device, message in ((8, 4, "cpu", "8 processes (7 workers): the target's 12 attention heads"),
                                          (3, 3, "cuda", "3 processes on this node take a GPU each"),
                                          (4, 4, None, "it has 2: run fewer workers (1 here)")):
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_RANK", "1")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
        argv = ["--model", str(target), "--prompt", "w3"] + (["--worker-device", device] if device else [])
        assert entry(argv) == 2
        assert message in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # one per process: it goes on to the rendezvous
    with pytest.raises(pytest.fail.Exception, match="rendezvous"):
        entry(["--model", str(target), "--prompt", "w3"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    code = main(["generate", "--model", str(target), "--prompt", "w3", "--workers", "2"])  # the launcher's check
    assert code == 2 and "3 processes on this node take a GPU each" in capsys.readouterr().err
    # the coordinator's own --device: one the node lacks, or a worker's GPU (found once every worker loaded)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    for device, message in (("cuda:5", "this process sees 4 CUDA GPU(s)"), ("cuda:1", "worker 1 takes that GPU")):
        code = main(["generate", "--model", str(target), "--prompt", "w3", "--workers", "2", "--device", device])
        assert code == 2 and message in capsys.readouterr().err
        assert entry(["--model", str(target), "--prompt", "w3", "--device", device]) == 2
        assert message in capsys.readouterr().err
    monkeypatch.setenv("GROUP_RANK", "1")  # another node's ranks: the coordinator's device is not theirs to check
    with pytest.raises(pytest.fail.Exception, match="rendezvous"):
        entry(["--model", str(target), "--prompt", "w3", "--device", "cuda:5"])


def test_under_torchrun_by_hand_rank_0_runs_the_commands_checks_before_the_model_loads(folders, tmp_path,
                                                                                       monkeypatch, capsys):
    """`torchrun ... -m triforce.launch.distributed batch|serve|generate`: the checks `--workers` runs
    before torchrun starts (an input, an output, a port) ran on rank 0 only inside the command, after every
    worker loaded its shard; a batch with nothing to answer loaded the whole group for nothing. Rank 0 now
    runs them right after the rendezvous and tells every rank the outcome."""
    import torch.distributed as dist

    from triforce.errors import UserError
    from triforce.launch import distributed
    from triforce.launch.distributed_checks import check_distributed_settings

    target, _ = folders
    told = []
    monkeypatch.setattr(distributed, "init_groups", lambda *a, **k: distributed.PipelineGroups(None, "control", None))
    monkeypatch.setattr(dist, "broadcast", lambda tensor, src, group: told.append((src, group, tensor.item())))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: None)
    for step in ("_coordinate", "_work"):
        monkeypatch.setattr(distributed, step, lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n")
    batch = ["batch", "-i", str(inp), "-o", str(out), "--model", str(target), "--worker-device", "cpu"]
    assert distributed.main(batch) == 0 and told == [(0, "control", 0)]
    assert "nothing to answer: --input holds no request" in capsys.readouterr().err
    told.clear()
    assert distributed.main(["--model", str(target), "--prompt-file", str(tmp_path / "gone.txt"),
                             "--worker-device", "cpu"]) == 2 and told == [(0, "control", 2)]
    assert "cannot read prompt file" in capsys.readouterr().err
    told.clear()
    monkeypatch.setattr("triforce.launch.batch_jobs._precheck", lambda args: 1 / 0)  # a bug: told too
    with pytest.raises(ZeroDivisionError):
        distributed.main(batch)
    assert told == [(0, "control", 1)]
    from argparse import Namespace

    with pytest.raises(UserError, match="--control-host auto dials the leader's host name"):
        check_distributed_settings(Namespace(control_host="auto", control_bind="127.0.0.1", retrieval_policy="static"))
    for timeout in (0.0, 1e7, float("inf"), float("nan")):  # 1e7: ZeroMQ's heartbeat in ms overflowed an int
        with pytest.raises(UserError, match="--worker-timeout must be a number of seconds > 0 and at most 1,000,000"):
            check_distributed_settings(Namespace(worker_timeout=timeout))


def completions(custom_ids_and_prompts) -> str:
    return "".join(json.dumps({"custom_id": k, "method": "POST", "url": "/v1/completions", "body": {
        "prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True}}) + "\n" for k, p in custom_ids_and_prompts)


def test_batch_with_workers_answers_every_line_and_the_group_reuses_the_document(tiny_dir, tmp_path, capfd):
    """`triforce batch --workers 2`: rank 0 runs the whole job (torchrun's RANK 0 of 3 is no shard) with the
    worker group verifying; each answer equals the single-process job's, and the questions after the
    first about one document get its first 512-token block from the workers' prefix store."""
    target = tiny_dir("dist-long-target", hidden_size=48, num_heads=12, num_kv_heads=6, num_layers=2, scale=25,
                      tokenizer=True, seed=82, max_position_embeddings=1024)
    document = " ".join(f"w{3 + (7 * i) % 90}" for i in range(600))
    inp = tmp_path / "in.jsonl"
    inp.write_text(completions((k, document + q) for k, q in (("a", " w5 w6"), ("b", " w9"), ("c", " w11 w12"))))
    common = ["batch", "--input", str(inp), "--model", str(target), "--dtype", "float32", "--device", "cpu",
              "--mode", "retrieval", "--budget", "32", "--chunk-size", "4", "--batch-size", "2"]
    assert main(common + ["--output", str(tmp_path / "one.jsonl"), "--prefix-cache-gb", "0"]) == 0
    assert main(common + ["--output", str(tmp_path / "group.jsonl"), "--workers", "2", "--control-port",
                          str(free_port()), "--worker-device", "cpu"]) == 0
    capfd.readouterr()
    one, group = ({r["custom_id"]: r["response"]["body"] for r in map(json.loads, (tmp_path / name).read_text().splitlines())}
                  for name in ("one.jsonl", "group.jsonl"))
    assert sorted(group) == ["a", "b", "c"]
    for k in group:
        assert group[k]["choices"][0]["text"] == one[k]["choices"][0]["text"]
    cached = [group[k]["usage"]["prompt_tokens_details"]["cached_tokens"] for k in "abc"]
    assert cached == [0, 512, 512]


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c", "sigint-to-the-command", "sigkill", "sigkill-to-torchrun"])
def test_serve_with_workers_answers_and_a_signal_ends_every_rank(folders, tmp_path, how):
    """`triforce serve --workers 1` over HTTP: a completion equals the single-process generate; SIGTERM to
    the command (as `kill` or a job manager sends), Ctrl-C (SIGINT to its process group) or SIGINT to the
    command alone (`kill -INT`, which once left the group serving), twice, ends torchrun and every rank
    (each in a session of its own), none left serving, and no traceback. SIGKILL to the command or to
    torchrun (the OOM killer; nothing to pass on) left the group serving: the child is told of its parent's end.
    The model is positional, as in vLLM's launch lines: the ranks, which parse the command again, served
    the default model before."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import httpx

    from triforce import LLM, SamplingParams

    target, _ = folders
    prompt = " ".join(f"w{3 + (5 * i) % 90}" for i in range(40))
    log = tmp_path / "serve.log"
    for attempt in range(3):  # a port another test took between free_port and the bind: again, on others
        port, control_port = free_port(), free_port()
        with log.open("w") as out:  # a file, not a pipe: ranks left behind must not hold the test up
            server = subprocess.Popen([sys.executable, "-m", "triforce", "serve", str(target), "--mode",  # vLLM's
                                       "retrieval", "--budget", "16", "--chunk-size", "4", "--dtype", "float32",
                                       "--device", "cpu", "--port", str(port), "--workers", "1", "--control-port",
                                       str(control_port), "--worker-device", "cpu"], stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)  # a foreground job of its own
        try:
            wait_healthy(f"http://127.0.0.1:{port}", server, log)
            break
        except AssertionError:
            if attempt == 2 or "Address already in use" not in log.read_text():
                server.kill()
                raise
            server.wait(timeout=60)
    def kill_torchrun():
        for pid in group_processes():
            if b"triforce.launch.torchrun" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)

    stop = {"sigterm": lambda: server.terminate(), "ctrl-c": lambda: os.killpg(server.pid, signal.SIGINT),
            "sigint-to-the-command": lambda: os.kill(server.pid, signal.SIGINT), "sigkill": server.kill,
            "sigkill-to-torchrun": kill_torchrun}[how]

    def group_processes():
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and f"{control_port}".encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
        return [pid for pid in found if pid != os.getpid()]

    try:
        url = f"http://127.0.0.1:{port}"
        r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                                      "ignore_eos": True}, timeout=60)
        assert r.status_code == 200, r.text
        llm = LLM(target, mode="retrieval", dtype="float32", device="cpu", budget=16, chunk_size=4)
        expected = llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].text
        assert r.json()["choices"][0]["text"] == expected
    finally:
        stop()
        time.sleep(0.5)
        stop()  # an impatient second one while the ranks shut down
        server.wait(timeout=60)

    for _ in range(300):
        if not group_processes():
            break
        time.sleep(0.1)
    left = group_processes()
    for pid in left:
        os.kill(pid, 9)
    assert not left, log.read_text()
    assert "Traceback" not in log.read_text(), log.read_text()


def test_torchrun_processes_get_an_even_share_of_the_cores_unless_the_user_chose(monkeypatch):
    """torchrun alone would give every process one OpenMP thread (a CPU coordinator on one core)."""
    import os

    from triforce.launch.with_workers import process_environment

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert process_environment(3, {"PATH": "/bin"}) == {"PATH": "/bin", "OMP_NUM_THREADS": "5"}
    assert process_environment(32, {})["OMP_NUM_THREADS"] == "1"
    assert process_environment(3, {"OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"


def test_an_error_on_the_coordinator_is_one_line_and_its_status(folders, capfd):
    """A request the coordinator refuses after torchrun started: its one-line error and exit status 2,
    without torchrun's multi-line failure report."""
    target, draft = folders
    argv = ["generate", "--model", str(target), "--draft", str(draft), "--prompt", "w3 w4 w5", "--max-new-tokens",
            "600", "--dtype", "float32", "--device", "cpu", "--workers", "2", "--control-port", str(free_port()),
            "--worker-device", "cpu"]
    assert main(argv) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("triforce: error:") and "positions" in err and "\n" not in err, err


def test_workers_without_a_control_port_get_a_free_one(folders, monkeypatch):
    """Two groups on one machine must not collide on the leader's port: `--workers` picks a free one
    unless --control-port is given; torchrun by hand keeps the documented default."""
    import subprocess

    from triforce.launch import distributed, with_workers
    from triforce.launch.cli import build_parser
    from triforce.launch.flags import DEFAULT_CONTROL_PORT

    launched = []

    class Torchrun:
        def __init__(self, cmd, env, **options):
            launched.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Torchrun)
    model = ["--model", str(folders[0])]  # (the default model would be fetched first on a new machine)
    for argv in (["generate", "--prompt", "x", "--workers", "1", *model],
                 ["serve", "--workers", "1", "--control-port", "4242", *model]):
        args = build_parser().parse_args(argv)
        args.argv = argv
        assert with_workers.launch_with_torchrun(args) == 0
    chosen = launched[0][launched[0].index("--control-port") + 1]
    assert int(chosen) != DEFAULT_CONTROL_PORT and "--workers" not in launched[0]
    # below the kernel's ephemeral ports, which torch.distributed's connections take while the model loads
    low = with_workers.ephemeral_ports()[0]
    assert with_workers.LOWEST_PORT <= int(chosen) < low or low <= with_workers.LOWEST_PORT
    for host in ("*", "::1"):  # ZeroMQ's wildcard, an IPv6 loopback (--control-bind): probed on 127.0.0.1
        assert with_workers.free_port(host) > 0
    assert launched[1].count("--control-port") == 1 and "4242" in launched[1] and "serve" in launched[1]
    assert distributed.control_port(build_parser().parse_args(["generate", "--prompt", "x"])) == DEFAULT_CONTROL_PORT


def test_a_control_port_in_use_is_a_one_line_error(folders, capfd, monkeypatch):
    """Said before torchrun starts (the leader binds it only once its shard has loaded, minutes later for a
    large model), and by the leader where the port is taken meanwhile."""
    import zmq

    from triforce.launch import with_workers

    target, _ = folders
    port = free_port()
    taken = zmq.Context.instance().socket(zmq.REP)
    taken.bind(f"tcp://127.0.0.1:{port}")
    argv = ["generate", "--model", str(target), "--prompt", "w3 w4 w5", "--mode", "ar", "--dtype", "float32",
            "--device", "cpu", "--workers", "1", "--control-port", str(port), "--worker-device", "cpu"]
    try:
        with monkeypatch.context() as before:
            before.setattr(with_workers, "run_torchrun", lambda *a, **k: pytest.fail("torchrun started"))
            assert main(argv) == 2
        monkeypatch.setattr(with_workers, "check_port_free", lambda host, port: None)  # taken as the group loads
        assert main(argv) == 2
    finally:
        taken.close(0)
    for said in capfd.readouterr().err.strip().splitlines():
        assert "cannot listen on" in said and "--control-port" in said and "Traceback" not in said, said


@pytest.mark.parametrize("exits, lines, status", [
    ({0: 2, 2: -15}, [], 2),  # rank 0 failed, torchrun stopped rank 2: the race CI once lost
    ({0: 2, 1: -9}, ["rank 1 was ended by signal 9"], 2),  # the kernel's OOM killer is news
    ({1: -9, 2: -15}, ["rank 1 was ended by signal 9"], 137),  # ... and torchrun then stopped rank 2: 128 + 9,
    ({1: -15, 2: -15}, ["rank 1 was ended by signal 15", "rank 2 was ended by signal 15"], 143),  # as a shell
])  # says a signal's death (it was 1, an error of the run's own to Slurm); kill by hand
def test_torchrun_names_the_ranks_a_signal_ended_unless_torchrun_sent_it(monkeypatch, capsys, exits, lines, status):
    """A failed run's report: one line per rank that a signal ended, but not the SIGTERM with which torchrun
    stops the other ranks once one failed otherwise (with an error status: that rank said why already;
    or by another signal, which has its own line)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from triforce.launch import torchrun

    def failing_run(args):
        failures = {rank: ProcessFailure(rank, 1000 + rank, code, "/nonexistent") for rank, code in exits.items()}
        raise ChildFailedError("triforce", failures)

    monkeypatch.setattr(torchrun, "run", failing_run)
    assert torchrun.main(["--nproc-per-node", "3", "-m", "triforce"]) == status
    assert [line.removeprefix("triforce: error: ") for line in capsys.readouterr().err.splitlines()] == lines


def test_a_commands_own_checks_run_before_the_worker_group_starts(tmp_path, monkeypatch, capsys):
    """With --workers, a missing prompt file, a port in use or a batch output in a missing folder was said
    by rank 0 once the workers had loaded their shards (docs/serving.md: "before the model loads"): now
    by the command itself, before torchrun starts."""
    import socket

    from triforce.launch import with_workers

    monkeypatch.setattr(with_workers, "launch_with_torchrun", lambda args: pytest.fail("the group was started"))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}\n')
    try:
        for argv, needle in ((["generate", "--prompt-file", str(tmp_path / "none.txt")], "cannot read prompt file"),
                             (["serve", "--port", str(taken.getsockname()[1])], "in use"),
                             (["batch", "-i", str(inp), "-o", str(tmp_path / "none" / "out.jsonl")], "no folder")):
            assert main([*argv, "--workers", "1", "--worker-device", "cpu"]) == 2
            assert needle in capsys.readouterr().err
    finally:
        taken.close()


def test_the_launchers_checks_leave_a_piped_input_to_rank_0(tmp_path, monkeypatch, capsys):
    """A batch input or prompt that is not a regular file (standard input, a pipe) was read to its end by
    the launcher's checks, and rank 0 then found it empty (a batch answered nothing and exited 0): the
    launcher leaves it to rank 0 and checks the rest, and does not shard by a RANK it exports."""
    import os

    from triforce.launch import with_workers

    launched = []
    monkeypatch.setattr(with_workers, "launch_with_torchrun", lambda args: launched.append(args) or 0)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    read, write = os.pipe()
    os.write(write, b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}\n')
    os.close(write)
    try:
        assert main(["batch", "-i", f"/dev/fd/{read}", "-o", str(tmp_path / "out.jsonl"), "--workers", "1",
                     "--worker-device", "cpu"]) == 0
        assert os.read(read, 1000).startswith(b'{"custom_id": "a"')  # still there for rank 0
    finally:
        os.close(read)
    assert launched and "shard" not in capsys.readouterr().err
    read, write = os.pipe()
    try:
        assert main(["generate", "--prompt-file", f"/dev/fd/{read}", "--temperature", "-1", "--workers", "1",
                     "--worker-device", "cpu"]) == 2  # the settings are still checked
        assert "temperature" in capsys.readouterr().err
    finally:
        os.close(read)
        os.close(write)


def test_a_piped_input_reaches_rank_0_as_torchruns_standard_input(folders, tmp_path, monkeypatch):
    """`--prompt-file <(cmd)` and `batch -i <(cmd)` with --workers: rank 0 opened /dev/fd/N, a descriptor of
    the launching process that torchrun does not pass on ("No such file or directory"). The launcher
    opens it, gives it to torchrun as standard input, and rank 0 reads `-`."""
    import os
    import subprocess

    from triforce.launch import with_workers
    from triforce.launch.cli import build_parser

    launched = []

    class Torchrun:
        def __init__(self, cmd, env, stdin=None, **options):
            launched.append((cmd, stdin.read() if stdin is not None else None))

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Torchrun)
    out = str(tmp_path / "out.jsonl")
    for command, flag, text in ((["generate"], "--prompt-file", b"w3 w4"), (["batch", "-o", out], "-i", b"{}\n")):
        read, write = os.pipe()
        os.write(write, text)
        os.close(write)
        try:
            argv = [*command, flag, f"/dev/fd/{read}", "--workers", "1", "--model", str(folders[0])]
            args = build_parser().parse_args(argv)
            args.argv = argv
            assert with_workers.launch_with_torchrun(args) == 0
        finally:
            os.close(read)
        cmd, stdin = launched.pop()
        assert stdin == text
        rank_args = build_parser().parse_args(cmd[cmd.index("triforce.launch.distributed") + 1:])
        assert (rank_args.prompt_file if command == ["generate"] else rank_args.input) == "-"
    # a shard of such an input (--shard, a Slurm array): rank 0 reads `-` whole and takes its shard
    import io
    import types

    from triforce.launch.batch_jobs import batch_plan

    line = '{"custom_id": "%s", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}\n'
    rank_args = build_parser().parse_args(["batch", "-i", "-", "-o", out, "--shard", "0/2"])
    rank_args.worker_channel = object()  # (rank 0, once the group shook hands)
    text = "".join(line % name for name in "abc").encode()
    monkeypatch.setattr("sys.stdin", types.SimpleNamespace(buffer=io.BytesIO(text), isatty=lambda: False))
    lines, _, mine, *_ = batch_plan(rank_args)
    assert len(lines) == 3 and [custom_id for _, custom_id, request, _ in mine if request is not None] == ["a", "c"]
    args = build_parser().parse_args(["generate", "--prompt-file", str(tmp_path), "--workers", "1"])
    args.argv = []
    with pytest.raises(UserError, match="cannot read"):  # a folder: not a pipe, and not readable
        with_workers.launch_with_torchrun(args)
    argv = ["generate", "--prompt", "x", "--workers", "1", "--model", str(folders[0])]
    args = build_parser().parse_args(argv)
    args.argv = argv
    assert with_workers.launch_with_torchrun(args) == 0 and launched.pop()[1] is None  # the terminal's stdin


def test_no_enable_prefix_caching_gives_the_workers_no_prefix_store():
    """vLLM's --no-enable-prefix-caching with --workers: each worker keeps no prompt blocks (they kept the
    default GB, and the coordinator, once every rank had loaded, refused to start)."""
    from argparse import Namespace

    from triforce.launch.distributed import _prefix_bytes

    assert _prefix_bytes(Namespace(enable_prefix_caching=False, prefix_cache_gb=1.0)) == 0
    assert _prefix_bytes(Namespace(enable_prefix_caching=None, prefix_cache_gb=0.5)) == 2**29
    assert _prefix_bytes(Namespace(prefix_cache_gb=2.0)) == 2**31  # (generate: no such flag)


def test_a_signal_that_ends_torchrun_leaves_no_traceback_of_its_finalizers(monkeypatch, capsys):
    """A SIGTERM ends torchrun (its parent killed): a finalizer of torch's rendezvous, its thread join cut
    short under load, printed "Exception ignored in" and a traceback as the process ended."""
    import signal
    import sys

    from torch.distributed.elastic.multiprocessing.api import SignalException

    from triforce.launch import torchrun

    def signalled(args):
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    monkeypatch.setattr(torchrun, "run", signalled)
    monkeypatch.setattr(torchrun, "ignore_further_signals", lambda: None)  # (this process's handlers kept)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    assert torchrun.main(["--nproc-per-node", "2", "-m", "triforce"]) == 128 + signal.SIGTERM

    class Finalizer:
        def __del__(self):
            raise RuntimeError("cannot join thread")

    Finalizer()
    assert "Exception ignored" not in capsys.readouterr().err
