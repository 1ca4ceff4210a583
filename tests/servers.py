"""Helpers for tests that start a server: a free loopback port (the launcher's), and waiting until
/health answers."""
import time

import httpx

from triforce.launch.distributed import free_port  # noqa: F401 (the tests' free port is the launcher's)


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
