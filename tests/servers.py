"""Helpers for tests that start a server: a free loopback port (the launcher's), waiting until /health
answers, and an app served by uvicorn in a thread."""
import threading
import time

import httpx
import openai
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from triforce.launch.with_workers import free_port  # noqa: F401 (the tests' free port is the launcher's)

KEY = "sk-test"
# A chat template that shows the tools and earlier calls; {# <tool_call> #} marks it as writing Hermes blocks
TOOLS_TEMPLATE = ("{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}. {% endif %}"
                  "{% for m in messages %}{{ m.role }}: {{ m.content or '' }}{% for c in m.tool_calls or [] %}"
                  "{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}. {% endfor %}"
                  "{% if add_generation_prompt %}>{% endif %}")


def chars_llm(tiny_dir, template: str = TOOLS_TEMPLATE):
    """An LLM of tiny models over single-character tokens (structured outputs can constrain them), with a
    chat template."""
    from triforce import LLM

    target = tiny_dir("chars-target", tokenizer="chars", seed=91, scale=25)
    draft = tiny_dir("chars-draft", tokenizer="chars", seed=92, num_layers=1, scale=25)
    model = LLM(target, draft, mode="triforce", dtype="float32", window=64, budget=16, chunk_size=4)
    model.tokenizer.chat_template = template
    return model


def wait_healthy(url: str, process=None, log=None, timeout_s: float = 120.0) -> None:
    """Until GET url/health answers 200; fails at once if `process` (a Popen) has exited, showing `log`
    (a path) if given."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}"
                                 + (f":\n{log.read_text()}" if log is not None else ""))
        time.sleep(0.1)
    raise AssertionError(f"{url} did not become healthy within {timeout_s:g} s")


class Server:
    """The app on a free loopback port, served by uvicorn in a thread until `close()`."""

    def __init__(self, app):
        port = free_port()
        self.app, self.url = app, f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_healthy(self.url)

    def client(self, key: str = KEY, timeout: float = 120) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=timeout)

    def metrics(self) -> dict:
        """(name, frozen labels) -> value of every sample of /metrics."""
        text = httpx.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def close(self):
        self.server.should_exit = True
        self.thread.join(30)
