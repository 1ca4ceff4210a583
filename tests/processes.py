"""Processes that tests start (worker groups, peers of a gloo world): forked from a server process that
has imported torch and triforce once (multiprocessing's "forkserver"), where a spawned process imported
them itself, 2-4 s of CPU each on 2 cores and a third of a worker group test's time. The server forks
before any torch work runs in it, so no thread pool is copied half-made."""
import multiprocessing

START_METHOD = "forkserver"
PRELOAD = ["torch", "torch.distributed", "triforce.workers.group", "triforce.workers.worker",
           "triforce.launch.distributed", "triforce.models.loader"]


def context():
    """The multiprocessing context to start them with (torch.multiprocessing: start_method=START_METHOD,
    after a call of this)."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # before the server starts; one list for every caller
    return multiprocessing.get_context(START_METHOD)
