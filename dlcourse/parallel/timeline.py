"""The timeline recorder: what each rank was doing, and when (lesson 03,
`lessons/03_data_parallel.ipynb`; lesson 05's reduce-scatters and lesson 06's pipeline stages
record with it too). `dlcourse.plots.timeline.plot_timeline` draws what it records.

In a rank, a `Timeline` records spans (a lane, a name, a start and an end); the ranks return
their spans, and the lesson draws them all on one time axis:

    timeline = Timeline(rank)
    with timeline.span("compute", "forward"):
        ...
    spans = sum(dlcourse.launch(job), [])       # every rank's spans

Times come from `now`, `time.perf_counter()`: on Linux the system-wide CLOCK_MONOTONIC, so
spans from different processes on one machine share a time axis. Ranks on several machines do
not.
"""

import contextlib
import time
from dataclasses import dataclass

now = time.perf_counter  # the one clock every recorder reads: shared by the ranks of a host


@dataclass
class Span:
    rank: int
    lane: str  # the row it is drawn in within its rank, e.g. "compute" or "all-reduce"
    name: str  # what ran, e.g. "backward" or "bucket 2"; one colour per name
    start: float  # seconds, `now()`
    end: float

    @property
    def duration(self):
        return self.end - self.start


class Timeline:
    """The spans recorded in one rank. `add` may be called from a communication thread (a
    future's callback): appending to a list is atomic in CPython."""

    now = staticmethod(now)

    def __init__(self, rank):
        self.rank = rank
        self.spans = []

    def add(self, lane, name, start, end):
        self.spans.append(Span(self.rank, lane, name, start, end))

    @contextlib.contextmanager
    def span(self, lane, name):
        start = self.now()
        try:
            yield
        finally:
            self.add(lane, name, start, self.now())
