"""A soak load for `triforce serve` (docs/serving.md, Memory over hours): 2-4 client threads for DURATION_S
seconds sending completions and chats, streamed and not, prompts of up to 3,000 tokens cut from the
Austen novels, n 2, log-probabilities, JSON schemas, clients that hang up mid-stream and bad requests;
every 30 s the server's VmRSS and /metrics and a fixed greedy probe.

    python benchmarks/soak_load.py PORT SERVER_PID DURATION_S   # writes $SOAK_OUT/requests.jsonl, monitor.jsonl

$SOAK_DATA: the folder of austen-*.txt (default ../shared/data). benchmarks/results/soak/soak.sh starts a
server and runs it."""
import json, os, random, sys, threading, time
import httpx

PORT, SPID, DUR = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
BASE = f"http://127.0.0.1:{PORT}"
OUT = os.environ.get("SOAK_OUT", ".")
DATA = os.environ.get("SOAK_DATA", "../shared/data")
T0 = time.time()
END = T0 + DUR
lock = threading.Lock()
reqlog = open(f"{OUT}/requests.jsonl", "w")
monlog = open(f"{OUT}/monitor.jsonl", "w")
inflight = [0]

TEXTS = []
for f in sorted(os.listdir(DATA)):
    if f.startswith("austen-"):
        TEXTS.append(open(os.path.join(DATA, f), encoding="utf-8", errors="replace").read())
SHORT = ["It is a truth universally acknowledged", "Once upon a time", "The capital of France is",
         "Write a haiku about the sea.", "def fibonacci(n):", "List three colors:", "Q: What is 2+2?\nA:"]
CHAT_Q = ["What is the capital of France?", "Tell me a short joke.", "Explain photosynthesis in two sentences.",
          "Write a limerick about a cat.", "Give me three tips for sleeping well.", "What is 17 * 23?"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def long_prompt(rng):
    t = rng.choice(TEXTS)
    n = rng.randint(4000, 12000)  # ~1000-3000 tokens
    if rng.random() < 0.3:
        s = 5000  # shared prefix sometimes -> prefix cache reuse
    else:
        s = rng.randint(0, len(t) - n - 1)
    return t[s:s + n] + "\n\nSummarize the passage above in one sentence:"


def record(**kw):
    kw["t"] = round(time.time() - T0, 3)
    with lock:
        reqlog.write(json.dumps(kw) + "\n")
        reqlog.flush()


def bad_request(rng):
    cases = [
        ("/v1/completions", {"model": "smollm2", "prompt": "hi", "temperature": -1}),
        ("/v1/completions", {"model": "smollm2", "prompt": "hi", "max_tokens": -5}),
        ("/v1/completions", {"model": "smollm2", "prompt": "hi", "n": 0}),
        ("/v1/completions", {"model": "smollm2", "prompt": "hi", "logprobs": 50}),
        ("/v1/completions", {"model": "smollm2", "prompt": "hi", "frobnicate": 3}),
        ("/v1/chat/completions", {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
                                   "response_format": {"type": "json_schema", "json_schema": {"schema": 5}}}),
        ("/v1/chat/completions", {"model": "smollm2", "messages": "nope"}),
        ("/v1/chat/completions", {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "top_p": 2}),
        ("/v1/completions", {"model": "nosuchmodel", "prompt": "hi"}),
        ("/v1/completions", "{not json"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x " * 9000, "max_tokens": 10}),
    ]
    return rng.choice(cases)


def do_one(cl, rng, kind):
    """Returns dict of results."""
    temp = rng.choice([0.0, 0.7])
    mt = rng.randint(16, 200)
    r = {"kind": kind, "temp": temp, "max_tokens": mt}
    body = None
    path = "/v1/completions"
    stream = False
    disconnect_after = None
    if kind == "bad":
        path, body = bad_request(rng)
        r["case"] = (body[:20] if isinstance(body, str) else {k: (v if len(str(v)) < 60 else "...") for k, v in body.items()})
        t = time.time()
        if isinstance(body, str):
            resp = cl.post(BASE + path, content=body, headers={"Content-Type": "application/json"})
        else:
            resp = cl.post(BASE + path, json=body)
        r.update(status=resp.status_code, lat=time.time() - t)
        try:
            j = resp.json(); r["err"] = j.get("error", {}).get("message", "")[:120]
        except Exception:
            r["err"] = "non-json: " + resp.text[:100]
        return r
    if kind.startswith("comp"):
        prompt = long_prompt(rng) if "long" in kind else rng.choice(SHORT)
        body = {"model": "smollm2", "prompt": prompt, "max_tokens": mt if "long" not in kind else rng.randint(16, 64),
                "temperature": temp}
    else:
        path = "/v1/chat/completions"
        q = rng.choice(CHAT_Q)
        if "long" in kind:
            q = long_prompt(rng)
        body = {"model": "smollm2", "messages": [{"role": "user", "content": q}], "max_tokens": mt, "temperature": temp}
    if "n2" in kind:
        body["n"] = 2
    if "lp" in kind:
        if path.endswith("chat/completions"):
            body["logprobs"] = True; body["top_logprobs"] = 2
        else:
            body["logprobs"] = 3
    if "stop" in kind:
        body["stop"] = rng.choice([["\n"], [".", "!"], [" the "], ["\n\n", "and"]])
    if "json" in kind:
        body["messages"][0]["content"] = "Make up a person and give their name and age as JSON."
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        body["max_tokens"] = rng.randint(40, 120)
    if "stream" in kind or "disc" in kind:
        stream = True
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if "disc" in kind:
        disconnect_after = rng.randint(1, 5)
        body["max_tokens"] = 200
        body["ignore_eos"] = True
    r["max_tokens"] = body["max_tokens"]
    t = time.time()
    if kind == "abort_nonstream":
        body["max_tokens"] = 200; body["ignore_eos"] = True
        try:
            cl.post(BASE + path, json=body, timeout=rng.uniform(0.5, 2.0))
            r.update(status="completed_before_timeout", lat=time.time() - t)
        except httpx.TimeoutException:
            r.update(status="client_abort", lat=time.time() - t)
        return r
    if not stream:
        resp = cl.post(BASE + path, json=body)
        lat = time.time() - t
        r.update(status=resp.status_code, lat=lat)
        if resp.status_code != 200:
            r["err"] = resp.text[:300]
            return r
        j = resp.json()
        u = j.get("usage", {})
        r["ptok"] = u.get("prompt_tokens"); r["ctok"] = u.get("completion_tokens")
        r["cached"] = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
        ch = j["choices"]
        r["nchoices"] = len(ch)
        r["finish"] = [c.get("finish_reason") for c in ch]
        texts = [c["text"] if "text" in c else (c["message"].get("content") or "") for c in ch]
        r["text0"] = texts[0][:80]
        probs = []
        if "n2" in kind and len(ch) != 2:
            probs.append(f"expected 2 choices got {len(ch)}")
        if "stop" in kind:
            for tx in texts:
                for s in body["stop"]:
                    if s in tx:
                        probs.append(f"stop string {s!r} in output")
        if "json" in kind:
            for c, tx in zip(ch, texts):
                if c.get("finish_reason") == "stop":
                    try:
                        o = json.loads(tx)
                        if not (isinstance(o, dict) and set(o) == {"name", "age"} and isinstance(o["age"], int)):
                            probs.append(f"json not schema: {tx[:100]}")
                    except Exception:
                        probs.append(f"json invalid: {tx[:100]}")
        if "lp" in kind:
            for c in ch:
                lp = c.get("logprobs")
                if lp is None:
                    probs.append("no logprobs"); continue
                nlp = len(lp["content"]) if "content" in lp else len(lp["tokens"])
                r.setdefault("nlp", []).append(nlp)
                if "tokens" in lp and "".join(lp["tokens"]) != c["text"]:
                    probs.append("logprob tokens don't join to text")
            if len(ch) == 1 and r.get("nlp") and r["nlp"][0] != r["ctok"]:
                probs.append(f"logprob entries {r['nlp'][0]} != completion_tokens {r['ctok']}")
        sum_ct = r["ctok"]
        if sum_ct is not None and sum_ct > body["max_tokens"] * len(ch):
            probs.append("completion tokens exceed max_tokens")
        if probs:
            r["problems"] = probs
        return r
    # streaming
    chunks = 0; first = None; usage = None; texts = {}; finishes = {}; done = False; lastt = None
    with cl.stream("POST", BASE + path, json=body) as resp:
        r["status"] = resp.status_code
        if resp.status_code != 200:
            resp.read(); r["err"] = resp.text[:300]; r["lat"] = time.time() - t
            return r
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            d = line[6:]
            if d == "[DONE]":
                done = True; break
            j = json.loads(d)
            if "error" in j:
                r.setdefault("problems", []).append("stream error: " + str(j["error"])[:200])
            if j.get("usage"):
                usage = j["usage"]
            for c in j.get("choices", []):
                i = c.get("index", 0)
                piece = c.get("text") if "text" in c else (c.get("delta", {}).get("content") or "")
                texts[i] = texts.get(i, "") + (piece or "")
                if c.get("finish_reason"):
                    finishes[i] = c["finish_reason"]
                if piece:
                    chunks += 1
                    now = time.time()
                    if first is None:
                        first = now
                    lastt = now
            if disconnect_after is not None and chunks >= disconnect_after:
                r["status"] = "client_disconnect"
                break
    r["lat"] = time.time() - t
    r["ttft"] = (first - t) if first else None
    r["chunks"] = chunks
    r["done"] = done
    if usage:
        r["ptok"] = usage.get("prompt_tokens"); r["ctok"] = usage.get("completion_tokens")
    if first and lastt and r.get("ctok") and r["ctok"] > 1:
        r["tpot"] = (lastt - first) / (r["ctok"] - 1)
    r["finish"] = [finishes.get(i) for i in sorted(texts)]
    r["text0"] = texts.get(0, "")[:80]
    if disconnect_after is None:
        if not done:
            r.setdefault("problems", []).append("no [DONE]")
        if "stop" in kind:
            for tx in texts.values():
                for s in body["stop"]:
                    if s in tx:
                        r.setdefault("problems", []).append(f"stop string {s!r} in streamed output")
    return r


KINDS = [("comp", 10), ("comp_stream", 10), ("chat", 8), ("chat_stream", 8), ("comp_long", 5),
         ("chat_long_stream", 3), ("comp_n2", 4), ("chat_n2_stream", 3), ("comp_lp", 4), ("chat_lp", 3),
         ("comp_stream_lp", 2), ("comp_stop", 4), ("chat_stop_stream", 3), ("chat_json", 4), ("chat_json_stream", 2),
         ("comp_disc", 4), ("chat_disc", 3), ("comp_long_disc", 2), ("abort_nonstream", 2), ("bad", 6)]
KN = [k for k, _ in KINDS]; KW = [w for _, w in KINDS]


def active(wid):
    m = (time.time() - T0) / 60
    if wid < 2:
        return True
    if wid == 2:
        return int(m // 3) % 2 == 0
    return int(m // 2) % 3 == 0


def worker(wid):
    rng = random.Random(1000 + wid)
    cl = httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0))
    while time.time() < END:
        if not active(wid):
            time.sleep(2); continue
        kind = rng.choices(KN, KW)[0]
        with lock:
            inflight[0] += 1; conc = inflight[0]
        t = time.time()
        try:
            r = do_one(cl, rng, kind)
        except Exception as e:
            r = {"kind": kind, "status": "exception", "lat": time.time() - t, "err": repr(e)[:300]}
        finally:
            with lock:
                inflight[0] -= 1
        r["wid"] = wid; r["conc"] = conc
        record(**r)
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0, 3))


def probe(cl, tag):
    body = {"model": "smollm2", "prompt": "It is a truth universally acknowledged", "max_tokens": 48,
            "temperature": 0, "ignore_eos": True}
    t = time.time()
    try:
        resp = cl.post(BASE + "/v1/completions", json=body)
        j = resp.json()
        r = {"kind": "probe", "tag": tag, "status": resp.status_code, "lat": time.time() - t,
             "ctok": j["usage"]["completion_tokens"], "text": j["choices"][0]["text"]}
    except Exception as e:
        r = {"kind": "probe", "tag": tag, "status": "exception", "err": repr(e), "lat": time.time() - t}
    with lock:
        r["conc"] = inflight[0]
    record(**r)
    return r


def rss_tree(pid):
    tot = 0; pids = [pid]
    try:
        for line in open(f"/proc/{pid}/task/{pid}/children").read().split():
            pids.append(int(line))
    except Exception:
        pass
    out = {}
    for p in pids:
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS"):
                    out[p] = int(line.split()[1]); tot += out[p]
        except Exception:
            pass
    return tot, out


def metrics(cl):
    txt = cl.get(BASE + "/metrics").text
    m = {}
    for line in txt.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if any(k in line for k in ["num_requests", "request_success", "request_failures", "prefix_cache",
                                    "prompt_tokens_total", "generation_tokens_total"]):
            name, val = line.rsplit(" ", 1)
            m[name] = float(val)
    return m


def monitor():
    cl = httpx.Client(timeout=30)
    while time.time() < END + 5:
        tot, per = rss_tree(SPID)
        try:
            m = metrics(cl)
        except Exception as e:
            m = {"err": repr(e)}
        rec = {"t": round(time.time() - T0, 1), "rss_kb": tot, "per": per, "inflight": inflight[0], "metrics": m}
        with lock:
            monlog.write(json.dumps(rec) + "\n"); monlog.flush()
        probe(cl, "periodic")
        time.sleep(max(0, 30 - (time.time() - T0) % 30))


if __name__ == "__main__":
    c0 = httpx.Client(timeout=120)
    probe(c0, "start")
    ths = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(4)]
    ths.append(threading.Thread(target=monitor, daemon=True))
    for th in ths:
        th.start()
    for th in ths:
        th.join(timeout=max(1, END - time.time() + 900))
    alive = [th.name for th in ths if th.is_alive()]
    print("threads still alive (hung?):", alive)
    time.sleep(3)
    probe(c0, "end")
    tot, per = rss_tree(SPID)
    m = metrics(c0)
    with lock:
        monlog.write(json.dumps({"t": round(time.time() - T0, 1), "rss_kb": tot, "per": per, "final": True, "metrics": m}) + "\n")
    print("done", time.time() - T0)
