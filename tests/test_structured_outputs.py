"""Structured outputs where users reach them: LLM.generate (SamplingParams.structured_outputs), the
server (OpenAI's response_format, vLLM's structured_outputs and guided_* fields, through the `openai`
client too) and `triforce generate` flags, on tiny models whose tokens are single characters."""
import json
import re

import openai
import pytest
from fastapi.testclient import TestClient

from mode_settings import for_mode
from servers import Server
from triforce import LLM, SamplingParams
from triforce.config import ConfigError
from triforce.sampling_params import StructuredOutputs
from triforce.coordinator.batch import SequenceBatch
from triforce.coordinator.batchmates import Batchmates
from triforce.launch.cli import main
from triforce.request import Request
from triforce.serve.app import create_app

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["id", "ok"], "additionalProperties": False}
SETTINGS = dict(dtype="float32", window=64, budget=16, chunk_size=4)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}>{% endif %}"
PROMPT = "the quick brown fox jumps over 13 lazy dogs, then {\"id\": 7, \"ok\": true} and red-blue-green. " * 3


@pytest.fixture(scope="module")
def models(tiny_dir):
    return (tiny_dir("chars-target", tokenizer="chars", seed=91, scale=25),
            tiny_dir("chars-draft", tokenizer="chars", seed=92, num_layers=1, scale=25))


@pytest.fixture(scope="module")
def llm(models):
    target, draft = models
    model = LLM(target, draft, mode="triforce", **for_mode("triforce", SETTINGS))
    model.tokenizer.chat_template = CHAT_TEMPLATE
    return model


def test_each_constraint_shapes_the_text_and_every_mode_agrees(llm, models):
    target, draft = models
    free = llm.generate(PROMPT, SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))[0]
    cases = [(StructuredOutputs(json=SCHEMA), lambda t: set(json.loads(t)) == {"id", "ok"}),
             (StructuredOutputs(json_object=True), lambda t: isinstance(json.loads(t), dict)),
             (StructuredOutputs(regex="[a-f]{3}-[0-9]+"), lambda t: re.fullmatch("[a-f]{3}-[0-9]+", t)),
             (StructuredOutputs(choice=["red", "green", "blue"]), lambda t: t in ("red", "green", "blue"))]
    ar = LLM(target, None, mode="ar", **for_mode("ar", SETTINGS))
    for spec, fits in cases:
        params = SamplingParams(max_tokens=60, temperature=0, structured_outputs=spec)
        out = llm.generate(PROMPT, params)[0]
        assert out.finish_reason == "stop" and fits(out.text), (spec, out.text)  # complete, ended by EOS
        assert out.text != free.text and out.token_ids == ar.generate(PROMPT, params)[0].token_ids
    # sampled too: every text is the constraint's
    for seed in range(3):
        params = SamplingParams(max_tokens=60, temperature=1.0, seed=seed,
                                structured_outputs=StructuredOutputs(choice=["red", "green", "blue"]))
        assert llm.generate(PROMPT, params)[0].text in ("red", "green", "blue")


def test_a_batch_of_requests_with_their_own_constraints_gives_each_what_it_gets_alone(llm):
    """Each request of a batch has its own matcher (and none): its answer is what it gets alone."""
    specs = [StructuredOutputs(json=SCHEMA), None, StructuredOutputs(regex="[a-f]{3}-[0-9]+"),
             StructuredOutputs(choice=["red", "green", "blue"])]
    params = [SamplingParams(max_tokens=40, temperature=t, seed=5, ignore_eos=spec is None, structured_outputs=spec)
              for spec, t in zip(specs, (0, 0.8, 1.0, 0))]
    prompts = [PROMPT, PROMPT[:90], PROMPT[30:], PROMPT[:150]]
    together = llm.generate(prompts, params)
    alone = [llm.generate(p, sp)[0] for p, sp in zip(prompts, params)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert together[3].text in ("red", "green", "blue") and len(together[1].token_ids) == 40


def test_the_package_names_the_constraint_as_vllm_does():
    """`from triforce import StructuredOutputs` and vLLM's `StructuredOutputsParams` (one class), and the
    package's lazily loaded names are in its dir() (a REPL completes them)."""
    import triforce
    from triforce import StructuredOutputsParams

    assert StructuredOutputsParams is triforce.StructuredOutputs is StructuredOutputs
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=SCHEMA))
    assert json.loads(params.structured_outputs.json) == SCHEMA
    assert set(triforce.__all__) <= set(dir(triforce))


def test_a_bad_constraint_is_refused_before_anything_runs(llm):
    with pytest.raises(ConfigError, match="^structured_outputs regex"):
        llm.generate(PROMPT, SamplingParams(structured_outputs=StructuredOutputs(regex="[a-")))
    with pytest.raises(ConfigError, match="^structured_outputs grammar: not a GBNF grammar"):
        llm.generate(PROMPT, SamplingParams(structured_outputs=StructuredOutputs(grammar='root ::= ("a"')))


def test_a_gbnf_grammar_is_taken_as_its_lark_twin(llm, client):
    """vLLM's guided_grammar examples write llama.cpp's GBNF (root ::= ...); it was a 400 (Expected token '_')."""
    params = {syntax: SamplingParams(max_tokens=20, temperature=0, structured_outputs=StructuredOutputs(grammar=g))
              for syntax, g in (("gbnf", 'root ::= "red" | "blue" ("-" [0-9])*'),
                                ("lark", 'start: "red" | "blue" ("-" /[0-9]/)*'),
                                ("lark ?start", '?start: "red" | "blue" ("-" /[0-9]/)*'))}  # Lark's own form
    texts = {syntax: llm.generate(PROMPT, p)[0].text for syntax, p in params.items()}
    assert texts["gbnf"] == texts["lark"] == texts["lark ?start"], texts
    assert re.fullmatch(r"red|blue(-[0-9])*", texts["gbnf"]), texts
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 20, "temperature": 0,
                                             "guided_grammar": 'root ::= "red" | "blue" ("-" [0-9])*'})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == texts["gbnf"], r.text


@pytest.fixture
def client(llm):
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


@pytest.mark.parametrize("fields,spec", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
     StructuredOutputs(json=SCHEMA)),
    ({"response_format": {"type": "json_object"}}, StructuredOutputs(json_object=True)),
    ({"guided_regex": "[a-f]{3}-[0-9]+"}, StructuredOutputs(regex="[a-f]{3}-[0-9]+")),
    ({"guided_choice": ["red", "green"]}, StructuredOutputs(choice=["red", "green"])),
    ({"guided_json": SCHEMA}, StructuredOutputs(json=SCHEMA)),
    ({"structured_outputs": {"regex": "ab+"}}, StructuredOutputs(regex="ab+")),
])
def test_the_server_takes_each_way_of_asking_as_generate_does(llm, client, fields, spec):
    expected = llm.generate(PROMPT, SamplingParams(max_tokens=40, temperature=0, structured_outputs=spec))[0]
    for path, body in (("/v1/completions", {"prompt": PROMPT}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "ab"}]})):
        r = client.post(path, json={**body, "max_tokens": 40, "temperature": 0, **fields})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        if path == "/v1/completions":
            assert text == expected.text
        assert llm.grammars.guide(spec).allowed(llm.tokenizer.encode(text)) is not None, text  # chat's too


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"yaml": "a"}}, "structured_outputs"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
    ({"guided_json": {"type": "object"}, "min_tokens": 2}, "min_tokens"),
])
def test_bad_constraints_get_a_400_naming_the_field(client, fields, param):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_the_openai_client_asks_for_a_json_schema(llm):
    """The client's own response_format shape (json_schema with a name and strict), over HTTP."""
    server = Server(create_app(llm, "tiny"))
    try:
        answer = server.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "ab"}], max_tokens=60, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "row", "schema": SCHEMA, "strict": True}})
        with pytest.raises(openai.BadRequestError, match="guided_regex"):
            server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=4,
                                               extra_body={"guided_regex": "(unclosed"})
    finally:
        server.close()
    text = answer.choices[0].message.content  # the schema's JSON, or a start of it cut by max_tokens
    assert llm.grammars.guide(StructuredOutputs(json=SCHEMA)).allowed(llm.tokenizer.encode(text)) is not None
    assert answer.choices[0].finish_reason == "length" or set(json.loads(text)) == {"id", "ok"}


def test_generate_flags(capsys, models):
    target, draft = models
    args = ["generate", "--model", target, "--draft", draft, "--mode", "triforce", "--dtype", "float32", "--window",
            "64", "--budget", "16", "--chunk-size", "4", "--prompt", PROMPT, "--max-new-tokens", "40",
            "--temperature", "0", "--json"]
    assert main([*map(str, args), "--choice", "red", "--choice", "blue"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] in ("red", "blue")
    assert main([*map(str, args), "--regex", "[0-9]+x"]) == 0
    assert re.fullmatch("[0-9]+x?", json.loads(capsys.readouterr().out)["text"])
    long_schema = json.dumps({**SCHEMA, "description": "x" * 300})  # too long to be a file name
    for schema in (json.dumps(SCHEMA), long_schema):
        assert main([*map(str, args), "--json-schema", schema]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["finish_reason"] == "stop" and set(json.loads(out["text"])) == {"id", "ok"}
    assert main([*map(str, args), "--regex", "[0-9"]) == 2
    assert capsys.readouterr().err.startswith("triforce: error: --regex: ")  # named by its flag
    # rules that contradict each other after a streamed token: the error on a line of its own
    a, b = (target_tokenizer_id(target, c) for c in "ab")
    streamed = [str(arg) for arg in args if arg != "--json"]
    assert main([*streamed, "--regex", "a[0-9]", "--allowed-token-id", str(a), "--allowed-token-id", str(b)]) == 2
    out = capsys.readouterr()
    assert out.out == "a\n" and out.err.startswith("triforce: error: --allowed-token-id and the structured output")


def target_tokenizer_id(model, token: str) -> int:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model).convert_tokens_to_ids(token)


def test_bans_that_leave_the_constraint_no_first_token_are_refused(llm):
    """allowed_token_ids or bad words that exclude every token a constraint may begin with contradict it; the
    rule applied last won, silently (text breaking the regex, or a banned word). Bans that leave it one run."""
    digits = [llm.tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]
    letters = [llm.tokenizer.convert_tokens_to_ids(c) for c in "abc"]
    regex = StructuredOutputs(regex="[0-9]+")
    for bans in (dict(allowed_token_ids=letters), dict(bad_words_ids=[[d] for d in digits])):
        with pytest.raises(ConfigError, match="leave no token the structured output allows"):
            llm.generate(PROMPT, SamplingParams(max_tokens=4, structured_outputs=regex, **bans))
    out = llm.generate(PROMPT, SamplingParams(max_tokens=4, temperature=0, structured_outputs=regex,
                                              allowed_token_ids=letters + digits[3:5], bad_words_ids=[[digits[4]]]))[0]
    assert set(out.text) == {"3"}


def test_rules_that_contradict_each_other_later_end_the_request_with_an_error(llm, client):
    """Where the rules leave no token after some tokens (allowed_token_ids that the constraint rules out
    after its first letter; a two-token bad word that bans the last allowed token), the target's row fell
    back on the tokens of the rule applied last, and the text silently broke the other. Now the request
    fails naming the rules; over the server alone (400), its batchmate's answer untouched."""
    ids = {c: llm.tokenizer.convert_tokens_to_ids(c) for c in "ab0"}
    regex = StructuredOutputs(regex="a[0-9]")
    cases = [(dict(structured_outputs=regex, allowed_token_ids=[ids["a"], ids["b"]]),
              "allowed_token_ids and the structured output leave no token to choose after 1 generated token:"),
             (dict(allowed_token_ids=[ids["a"], ids["b"]], bad_words_ids=[[ids["b"]], [ids["a"], ids["a"]]]),
              "allowed_token_ids and bad_words leave no token to choose after 1 generated token:"),
             (dict(structured_outputs=regex, bad_words_ids=[[ids["a"], d] for d in range(len(llm.tokenizer))]),
              "bad_words and the structured output leave no token to choose after 1 generated token:")]
    for mode in ("ar", "triforce"):
        model = llm if mode == "triforce" else LLM(llm.model_path, None, mode="ar", **for_mode("ar", SETTINGS))
        for settings, message in cases:
            for temperature in (0, 1.0):
                with pytest.raises(ConfigError, match=message):
                    model.generate(PROMPT, SamplingParams(max_tokens=6, temperature=temperature, seed=3, **settings))
    # in a batch, the request whose rules contradict each other ends alone: its batchmate's answer is its own
    params = [SamplingParams(max_tokens=6, temperature=0, **cases[0][0]),
              SamplingParams(max_tokens=6, temperature=0.8, seed=4)]
    batch, mates = SequenceBatch(), Batchmates()
    requests = [Request(llm, llm.encode(PROMPT), p, None, mates) for p in params]
    handles = [batch.add(r.run()) for r in requests]
    batch.run()
    with pytest.raises(ConfigError, match="contradict each other"):
        handles[0].result
    assert handles[1].result[0] == llm.generate(PROMPT, params[1])[0].token_ids
    # not a contradiction: allowed ids that leave out the end-of-sequence token, which ends a complete text
    # (the request failed once the text was complete, with max_tokens past its length)
    digits = [llm.tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]
    for temperature in (0, 1.0):
        out = llm.generate(PROMPT, SamplingParams(max_tokens=6, temperature=temperature, seed=2,
                                                  allowed_token_ids=digits,
                                                  structured_outputs=StructuredOutputs(regex="[0-9]{2}")))[0]
        assert re.fullmatch("[0-9]{2}", out.text) and out.finish_reason == "stop", out
    # the regex alone, and the same allowed ids without it, still run
    assert llm.generate(PROMPT, SamplingParams(max_tokens=6, temperature=0, structured_outputs=regex))[0].text[0] == "a"
    free = SamplingParams(max_tokens=6, temperature=0, allowed_token_ids=[ids["a"], ids["b"]])
    assert set(llm.generate(PROMPT, free)[0].text) <= {"a", "b"}
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "guided_regex": "a[0-9]",
            "allowed_token_ids": [ids["a"], ids["b"]]}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400 and "contradict each other" in r.json()["error"]["message"], r.text
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert "contradict each other" in events[-2] and events[-1] == "data: [DONE]"
    r = client.post("/v1/completions", json={**body, "allowed_token_ids": None})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == llm.generate(
        PROMPT, SamplingParams(max_tokens=6, temperature=0, structured_outputs=regex))[0].text


def test_a_text_the_vocabulary_cannot_finish_fails_where_the_output_goes_there_in_every_mode(llm, models):
    """(a{w}é|a{l}) with no token for é: after a{w} no text continues, and llguidance's mask there allowed
    only the end token, so ar stopped with a{w}, which the regex does not match; and once a proposer's
    tree had tried that branch the matcher stayed broken, so a request whose output went the other way
    failed as well. Now only an output that reaches the dead end fails, in every mode, with or without
    trees; a constraint of no text at all is refused before anything runs."""
    from triforce.speculation.guided import MatcherFailed

    target, draft = models
    ar = LLM(target, None, mode="ar", **for_mode("ar", SETTINGS))
    greedy = SamplingParams(max_tokens=6, temperature=0)

    def regex(text):
        return SamplingParams(max_tokens=6, temperature=0, structured_outputs=StructuredOutputs(regex=text))

    w = ar.generate(PROMPT, regex("a[bc]"))[0].text[1]  # the letter the target takes after a
    lost = "b" if w == "c" else "c"
    models_ = [ar, llm, LLM(target, draft, mode="triforce", tree1=4, **for_mode("triforce", SETTINGS)),
               LLM(target, draft, mode="draft", tree1=4, **for_mode("draft", SETTINGS))]
    for model in models_:
        out = model.generate(PROMPT, regex(f"(a{lost}\u00e9|a{w})"))[0]
        assert (out.text, out.finish_reason) == (f"a{w}", "stop")
        with pytest.raises(MatcherFailed, match="no text the constraint allows continues the 2 generated tokens"):
            model.generate(PROMPT, regex(f"(a{w}\u00e9|a{lost})"))
    with pytest.raises(ConfigError, match="^structured_outputs regex: no text it allows can be written"):
        llm.generate(PROMPT, SamplingParams(structured_outputs=StructuredOutputs(regex="[a&&b]")))
    assert llm.generate(PROMPT, greedy)[0].token_ids == ar.generate(PROMPT, greedy)[0].token_ids
