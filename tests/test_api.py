"""The Python API: vLLM-shaped LLM.generate, stop strings, streaming, token-id prompts."""
import pytest

from triforce import LLM, SamplingParams
from triforce.config import ConfigError

PROMPT = " ".join(f"w{3 + (7 * i) % 90}" for i in range(50))


@pytest.fixture(scope="module")
def llm(tiny_dir):
    target = tiny_dir("api-target", tokenizer=True, seed=51)
    draft = tiny_dir("api-draft", tokenizer=True, seed=52, num_layers=1)
    return LLM(target, draft, mode="triforce", dtype="float32", window=64, budget=16, chunk_size=4)


def test_generate_returns_one_output_per_prompt_in_order(llm):
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    outs = llm.generate([PROMPT, PROMPT + " w5"], params)
    assert len(outs) == 2 and all(len(o.token_ids) == 6 for o in outs)
    assert outs[0].token_ids == llm.generate(PROMPT, params)[0].token_ids
    assert outs[0].finish_reason == "length"


def test_token_id_prompts(llm):
    ids = llm.tokenizer(PROMPT).input_ids
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    assert llm.generate([ids], params)[0].token_ids == llm.generate(PROMPT, params)[0].token_ids


def test_stop_string_cuts_text_and_ends_generation(llm):
    free = llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    words = free.text.split()
    stop = words[6]
    first = free.text.index(stop)
    out = llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=[stop]))[0]
    assert out.text == free.text[:first] and out.finish_reason == "stop"
    assert len(out.token_ids) < 20


def test_streamed_pieces_join_to_the_text(llm):
    pieces = []
    out = llm.generate(PROMPT, SamplingParams(max_tokens=15, temperature=0.8, seed=2, ignore_eos=True),
                       stream=pieces.append)[0]
    assert "".join(pieces) == out.text and len(pieces) > 1


def test_unknown_engine_setting_is_refused(tiny_dir):
    with pytest.raises(ConfigError, match="gamma3"):
        LLM(tiny_dir("api-target", tokenizer=True, seed=51), gamma3=2)


def test_one_token_prompt(llm):
    out = llm.generate([[5]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
