"""Errors caused by the user's input. The CLI prints them as one line and exits non-zero; any other
exception is a bug in triforce and keeps its traceback."""


class UserError(ValueError):
    """Bad input: a setting, a model folder, a prompt. The message says what and why."""


class RequestFailed(UserError):
    """A request that its own settings fail as it runs: it alone ends (its batchmates run on), and a server
    answers it as a bad request."""


class TooLarge(RequestFailed):
    """A request whose caches the memory cannot hold even alone (a server's 413)."""


class NonFiniteLogits(RequestFailed):
    """A row the output would be sampled from holds NaN or infinity (a model's logits overflowed: a float16
    or bfloat16 model past its range): the request ends with this, not with a token drawn from garbage."""
