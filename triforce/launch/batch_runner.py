"""How `triforce batch` runs its request lines: on one continuous batch, as the server runs its requests
(serve/scheduler.py). Up to `--batch-size` lines are in flight at a time; a line that ends makes room for
the next at once, so a long answer holds back no other line (lines ran in lock-step groups, each group as
long as its longest answer), and the scheduler admits each where its caches fit beside the others'.

A line's choices (its prompts x `n`) run as sequences of the batch; its result is written once all have
ended. A line that fails as the server would answer it gets that answer (400 where its own settings fail
it as it runs, 413 where its caches can never fit); a line that fails on a bug (a 500: a step of the batch
fails every request in it, whichever failed) runs again alone once every other line in flight has ended,
and only then gets its 500, so the lines that ran beside it get their answers. A worker group that stops
answering, or any other UserError, ends the job, as before: the lines in flight get no result, and a
rerun runs them."""
from __future__ import annotations

import queue
import uuid
from dataclasses import dataclass, field
from functools import partial

from ..errors import RequestFailed, UserError
from ..serve import openai, responses
from ..serve.openai import ApiError
from ..serve.scheduler import Scheduler
from ..serve.tickets import failure
from .batch_output import ResultsWriter
from .batch_resume import result_id

QUEUE = 2 ** 31  # the scheduler's queue: bounded here by the lines in flight
POLL_S = 1.0  # how often a wait for an event checks that the scheduler still runs


@dataclass(eq=False)
class Line:
    """One attempt at a line: the scheduler's events name it, so those of an attempt that ended go unread."""
    text: str  # the input line, which its result's id is made from
    custom_id: str
    job: object  # a serve Job or ResponsesJob
    alone: bool = False  # run alone: a 500 now is its result
    outputs: list = field(default_factory=list)  # its choices' RequestOutputs as they end
    left: int = 0  # choices still running
    tickets: list = field(default_factory=list)


class LineRunner:
    def __init__(self, llm, model: str, write: ResultsWriter, lines_at_once: int):
        self.model, self.write, self.most = model, write, lines_at_once
        self.events: queue.Queue = queue.Queue()  # (line, choice, kind, data) from the scheduler's thread
        self.scheduler = Scheduler(llm, max_queue=QUEUE)
        self.running: list[Line] = []
        self.again_alone: list[Line] = []

    def run(self, text: str, custom_id: str, job) -> None:
        """Starts a line once there is room for it (results of others may be written meanwhile)."""
        if job.stream:  # as OpenAI's Batch API and other batch runners refuse it
            self._write_failed(Line(text, custom_id, job), ApiError(
                400, "'stream' is not available in a batch job: each result is written whole", param="stream"))
            return
        self._make_room()
        self._start(Line(text, custom_id, job))

    def finish(self) -> None:
        """Waits for every line in flight, and those to run again alone, to end and be written."""
        while self.running or self.again_alone:
            self._step()

    def close(self) -> None:
        self.scheduler.stop()

    def _make_room(self) -> None:
        """Steps until a line may start: fewer than `most` in flight, none alone, and no line waiting to run
        alone (which starts once every other has ended)."""
        while self.again_alone or len(self.running) >= self.most or any(line.alone for line in self.running):
            self._step()

    def _step(self) -> None:
        """Starts the first line waiting to run alone where none is in flight, else takes one event."""
        if self.again_alone and not self.running:
            failed = self.again_alone.pop(0)
            self._start(Line(failed.text, failed.custom_id, failed.job, alone=True))
        else:
            self._take_event()

    def _start(self, line: Line) -> None:
        count = len(line.job.prompts) * line.job.n
        line.outputs, line.left = [None] * count, count
        try:
            line.tickets = self.scheduler.submit_choices(
                line.job, [partial(self._tell, line, i) for i in range(count)])
        except ApiError as error:  # 413: its caches can never fit; 503: the scheduler stopped
            if error.status == 503:
                raise UserError(f"batch: {error.message}") from None
            self._write_failed(line, error)
            return
        except Exception as exc:  # noqa: BLE001 (its sizes, the memory free: a bug or a device's error, its 500)
            if isinstance(exc, UserError) and not isinstance(exc, RequestFailed):
                raise
            self._write_failed(line, failure(exc))
            return
        self.running.append(line)

    def _tell(self, line: Line, choice: int, kind: str, data) -> None:  # (the scheduler's thread)
        self.events.put((line, choice, kind, data))

    def _take_event(self) -> None:
        while True:
            try:
                line, choice, kind, data = self.events.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self.scheduler.alive and self.events.empty():  # (it tells every request as it stops)
                    raise UserError(f"batch: the scheduler stopped ({self.scheduler.fatal})") from None
        if line not in self.running:  # an attempt that ended already: a choice cancelled after another failed
            return
        if kind == "error":
            cause = data.__cause__
            if isinstance(cause, UserError) and not isinstance(cause, RequestFailed):  # a worker group gone
                raise UserError(f"batch: {cause}") from cause
            self.running.remove(line)
            for ticket in line.tickets:  # its other choices need not run on
                ticket.cancel()
            self._write_failed(line, data)
            return
        line.outputs[choice], line.left = data, line.left - 1
        if not line.left:
            self.running.remove(line)
            self._write_answer(line)

    def _write_answer(self, line: Line) -> None:
        try:
            answer = responses.response if isinstance(line.job, responses.ResponsesJob) else openai.response
            body = answer(line.job, self.model, line.outputs)
        except Exception as exc:  # noqa: BLE001 (a bug formatting it: its 500, and the job goes on)
            self.write(result(line.text, line.custom_id, self.write.internal_error(line.custom_id, request_id(), exc)))
            return
        self.write(result(line.text, line.custom_id, {"status_code": 200, "request_id": request_id(), "body": body}))

    def _write_failed(self, line: Line, error: ApiError) -> None:
        if error.status == 500 and not line.alone:
            self.again_alone.append(line)
            return
        if error.status == 500:
            cause = error.__cause__ if error.__cause__ is not None else error
            response = self.write.internal_error(line.custom_id, request_id(), cause)
        else:
            response = {"status_code": error.status, "request_id": request_id(), "body": error.body()}
        self.write(result(line.text, line.custom_id, response))


def request_id() -> str:
    """A result's request_id, as OpenAI's are: one of its own, not its body's id (which a line's request_id
    field names, as vLLM's server does: two lines could share it)."""
    return f"req_{uuid.uuid4().hex}"


def result(line: str, custom_id: str, response: dict | None = None, error: dict | None = None) -> dict:
    """An output line: a response (its status, its body), or the error of a line that is not a request."""
    return {"id": result_id(line), "custom_id": custom_id, "response": response, "error": error}
