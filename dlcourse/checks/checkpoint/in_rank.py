"""The rank side of lesson 11's checks: what runs in each rank while a student's `resume_state`,
`load_my_shard` or (graded) `is_complete` runs there. It imports none of the lesson's answers
(the run a resume saves, `checkpoint/run.py`, is not one) and holds no reference: under
`dlcourse grade` this is the one module of the set a rank loads (`answers.ANSWERS.rank_side`,
`grading/absent.py`); the whole tensor the pieces are compared with, and the trace of the run
that never stopped, are made outside the student's ranks.
"""

import os
import tempfile

from dlcourse.checkpoint.run import through_bytes, trained


class SavedFiles:
    """The saved chunks, one file each: `read(name)` returns its tensor and is counted."""

    def __init__(self, chunks):
        self._chunks, self.reads = chunks, []

    def read(self, name):
        if name not in self._chunks:
            raise KeyError(f"no saved file {name!r}; the metadata names {sorted(self._chunks)}")
        self.reads.append(name)
        return self._chunks[name].clone()


def saved_in_rank(student, cfg, k):
    """Runs in every rank of the resume check's first job: lesson 11's run trained k steps, and
    the student's state of it as a file would give it back (torch.save, torch.load)."""
    return through_bytes(student(trained(cfg, k)))


def load_in_rank(student, metadata, chunks):
    """Runs in every rank: the student's piece, and the files it read."""
    files = SavedFiles(chunks)
    got = student(metadata, files)
    return got, files.reads


def complete_in_rank(student, name, files):
    """Runs in a graded rank, whose /tmp is its own (`grading/rank_sandbox.py`), so the folder
    the check made in the checking process's /tmp is not there: the folder `name` rebuilt in
    this rank's /tmp from `files` ({path inside it: bytes}), and the student's verdict on it."""
    path = os.path.join(tempfile.mkdtemp(prefix="check_is_complete_"), name)
    os.makedirs(path)
    for relative, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(path, relative)), exist_ok=True)
        with open(os.path.join(path, relative), "wb") as f:
            f.write(data)
    return student(path)
