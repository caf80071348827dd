"""The errors a launch raises when ranks fail (lesson 00 shows one on purpose)."""


class RankError(RuntimeError):
    """A rank raised, exited or crashed; every rank was stopped.

    `rank` is the rank that failed first (the cause, not a peer that only saw it go),
    `traceback` its traceback or last output, `failures` every rank's own report.
    """

    def __init__(self, message, rank=None, traceback="", failures=None):
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback
        self.failures = failures or {}


class RankTimeout(RankError, TimeoutError):
    """The job was still running at its deadline; `running` lists the ranks that had not finished."""

    def __init__(self, message, running=(), failures=None):
        super().__init__(message, failures=failures)
        self.running = list(running)
