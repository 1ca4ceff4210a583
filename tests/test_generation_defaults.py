"""A model's generation_config.json sampling settings as request defaults, as vLLM takes them
(generation_defaults.py): in LLM.generate without sampling params, in the server's requests, in batch jobs."""
import json
import shutil

import pytest

from triforce import LLM, SamplingParams
from triforce.config import ConfigError
from triforce.launch.cli import main
from triforce.models.config import ModelLoadError
from triforce.serve import openai

PROMPT = " ".join(f"w{3 + (11 * i) % 90}" for i in range(40))
# greedy with a repetition penalty and a bound of 7 tokens; top_k 50 is transformers' default: no setting
SETTINGS = {"do_sample": True, "temperature": 0.0, "repetition_penalty": 1.5, "top_k": 50, "max_new_tokens": 7}


@pytest.fixture(scope="module")
def folder(tiny_dir, tmp_path_factory):
    """A model whose generation_config.json asks for SETTINGS (a copy: tiny_dir's folders are shared)."""
    model = tmp_path_factory.mktemp("generation") / "model"
    shutil.copytree(tiny_dir("generation-target", tokenizer=True, seed=61), model)
    (model / "generation_config.json").write_text(json.dumps(SETTINGS))
    return model


@pytest.fixture(scope="module")
def llm(folder):
    return LLM(folder, mode="ar", dtype="float32")


def test_the_models_settings_are_the_default_sampling_params(llm, folder, caplog):
    assert llm.sampling_defaults == {"temperature": 0.0, "repetition_penalty": 1.5, "max_tokens": 7}
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.0, repetition_penalty=1.5, max_tokens=7)
    own = llm.generate(PROMPT)[0]  # no sampling params: the model's
    assert own.token_ids == llm.generate(PROMPT, SamplingParams(temperature=0, repetition_penalty=1.5,
                                                                max_tokens=7))[0].token_ids
    plain = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=7))[0]
    assert len(own.token_ids) <= 7 and own.token_ids != plain.token_ids  # the penalty was applied
    neutral = LLM(folder, mode="ar", dtype="float32", generation_config="vllm")
    assert neutral.sampling_defaults == {} and neutral.get_default_sampling_params() == SamplingParams()
    caplog.clear()
    assert LLM(folder, mode="ar", dtype="float32").sampling_defaults  # vLLM says so as it loads
    assert "sampling defaults from" in caplog.text and "repetition_penalty=1.5" in caplog.text


def test_a_folder_gives_its_file_and_bad_values_are_left_out_with_a_warning(folder, tmp_path, caplog):
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"temperature": "hot", "top_p": 2, "top_k": 20,
                                                              "max_new_tokens": -1, "min_p": 0.1,
                                                              "repetition_penalty": True}))
    caplog.clear()
    assert LLM(folder, mode="ar", dtype="float32", generation_config=other).sampling_defaults == \
        {"top_k": 20, "min_p": 0.1}
    assert all(f"{key} {value!r} left out" in caplog.text for key, value in (
        ("temperature", "hot"), ("top_p", 2), ("max_new_tokens", -1), ("repetition_penalty", True)))
    assert "max_new_tokens must be an integer >= 1" in caplog.text
    with pytest.raises(ConfigError, match="no generation_config.json in that folder"):
        LLM(folder, mode="ar", dtype="float32", generation_config=tmp_path)
    for choice, message in ((other / "generation_config.json", "a file; name the folder"),
                            (tmp_path / "missing", "no such folder"), (None, "must be 'auto', 'vllm' or a folder")):
        with pytest.raises(ConfigError, match=message):
            LLM(folder, mode="ar", dtype="float32", generation_config=choice)
    (other / "generation_config.json").write_text("[1]")
    with pytest.raises(ModelLoadError, match="unreadable"):
        LLM(folder, mode="ar", dtype="float32", generation_config=other)


@pytest.mark.parametrize("settings, taken", [
    ({"temperature": 1.0, "top_p": 0.95}, {"temperature": 1.0, "top_p": 0.95}),  # 1.0 is no default here
    ({"do_sample": True, "top_k": 64}, {"temperature": 1.0, "top_k": 64}),  # do_sample: transformers' 1.0
    ({"do_sample": False, "temperature": 0.7}, {"temperature": 0.7}),  # vLLM reads no do_sample
    ({"top_k": 50, "top_p": 1.0, "min_p": 0, "repetition_penalty": 1.0}, {})])  # transformers' defaults
def test_what_a_file_sets(folder, tmp_path, settings, taken):
    """A model that asks to be sampled is (LLM.generate's own default is greedy, vLLM's temperature 1);
    transformers' defaults set nothing, as vLLM reads only the file's differences from them."""
    (tmp_path / "generation_config.json").write_text(json.dumps(settings))
    assert LLM(folder, mode="ar", dtype="float32", generation_config=tmp_path).sampling_defaults == taken


def test_without_sampling_params_max_tokens_stops_where_the_positions_do(folder, tmp_path):
    """A max_new_tokens past what a prompt leaves of the positions runs to the end of them, as vLLM's does
    (it failed every call without sampling params)."""
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 100000, "temperature": 0}))
    llm = LLM(folder, mode="ar", dtype="float32", generation_config=tmp_path)
    prompt = " ".join([PROMPT] * 12)
    for params in (None, llm.get_default_sampling_params()):  # given as vLLM's idiom passes them too
        out = llm.generate(prompt, params)[0]
        assert len(out.token_ids) == 512 - len(llm.encode(prompt)) and out.finish_reason == "length"


def test_the_server_takes_them_for_fields_a_request_leaves_out(llm, folder, monkeypatch):
    """As vLLM's server: the model's settings under what a request sets, its max_new_tokens the bound of
    every request's max_tokens (a completion's default of 16, a chat's whole context, or one asked)."""
    job = openai.parse("completion", {"prompt": PROMPT}, llm, "m")
    assert (job.params.temperature, job.params.repetition_penalty, job.params.max_tokens) == (0.0, 1.5, 7)
    job = openai.parse("completion", {"prompt": PROMPT, "temperature": 0.9, "repetition_penalty": 1.0,
                                      "max_tokens": 100}, llm, "m")
    assert (job.params.temperature, job.params.repetition_penalty, job.params.max_tokens) == (0.9, 1.0, 7)
    from triforce.serve import responses

    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    neutral = LLM(folder, mode="ar", dtype="float32", generation_config="vllm")
    for model in (llm, neutral):
        monkeypatch.setattr(model.tokenizer, "chat_template", template, raising=False)
    job = responses.parse({"input": PROMPT}, llm, "m")  # a Response says what it ran with
    assert (job.request["temperature"], job.request["max_output_tokens"]) == (0.0, 7)
    job = responses.parse({"input": PROMPT}, neutral, "m")  # the chat's bound: what the context leaves
    assert job.request["max_output_tokens"] == job.params.max_tokens == 512 - len(job.prompts[0])
    job = openai.parse("completion", {"prompt": PROMPT}, neutral, "m")
    assert (job.params.temperature, job.params.repetition_penalty, job.params.max_tokens) == (1.0, 1.0, 16)


def test_a_folders_end_of_sequence_ids_end_generation_too(llm, folder, tmp_path):
    """vLLM reads eos_token_id from the generation_config folder it is given, as from the model's own: a
    token id there ends generation (it ran past it), one outside the vocabulary is left out."""
    params = SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.5)
    plain = llm.generate(PROMPT, params)[0].token_ids
    end = plain[3]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [end, 10 ** 6]}))
    model = LLM(folder, mode="ar", dtype="float32", generation_config=tmp_path)
    out = model.generate(PROMPT, params)[0]
    assert out.token_ids == plain[: plain.index(end) + 1] and out.finish_reason == "stop"
    assert end in model.eos_ids() and 10 ** 6 not in model.eos_ids()


def test_batch_jobs_take_them_unless_told_vllm(folder, tmp_path, capsys):
    body = {"prompt": PROMPT, "max_tokens": 20, "ignore_eos": True}
    (tmp_path / "in.jsonl").write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                                                   "body": body}) + "\n")
    lengths = {}
    for choice in ("auto", "vllm"):
        out = tmp_path / f"{choice}.jsonl"
        assert main(["batch", "--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--model", str(folder),
                     "--mode", "ar", "--dtype", "float32", "--generation-config", choice]) == 0
        lengths[choice] = json.loads(out.read_text())["response"]["body"]["usage"]["completion_tokens"]
    assert lengths == {"auto": 7, "vllm": 20}
    code = main(["batch", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "x.jsonl"),
                 "--model", str(folder), "--mode", "ar", "--generation-config", str(tmp_path)])
    assert code == 2 and "--generation-config" in capsys.readouterr().err
