"""Lesson 10's two finders from a script under torchrun, as issue 26 asks ("usable from a notebook
cell and from a script under torchrun"): the divergence finder run on every rank of a torchrun
job, and the hang finder's recipe (`with CommTrace(folder): train()` on every rank; after the
hang, `find_hang(read_traces(folder))`)."""

import textwrap

from conftest import run_python

from dlcourse.debug.hang import find_hang, read_traces

DIVERGENCE = textwrap.dedent("""
    import torch.distributed as dist
    from dlcourse.debug import find_divergence

    if __name__ == "__main__":
        report = find_divergence("TP + SP (lesson 04)", bug="sp_layernorm_grads")
        first = report.first
        print(f"rank {dist.get_rank()}: {first.step} {first.phase} {first.name} {first.ranks}")
""")

HANG = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from dlcourse.debug.hang import CommTrace

    def train():
        t = torch.ones(4)
        dist.all_reduce(t)
        if dist.get_rank() == 0:  # rank 1 skips the second all-reduce: rank 0 waits for it
            dist.all_reduce(t)
        dist.all_reduce(torch.ones(8))

    if __name__ == "__main__":
        dist.init_process_group("gloo", timeout=timedelta(seconds=5))
        with CommTrace(sys.argv[1]):
            train()
""")


def _torchrun(tmp_path, body, *args):
    script = tmp_path / "job.py"
    script.write_text(body)
    return run_python("-m", "torch.distributed.run", "--nproc-per-node=2", str(script), *args,
                      timeout=240)


def test_the_divergence_finder_runs_on_every_rank_of_a_torchrun_job(tmp_path):
    done = _torchrun(tmp_path, DIVERGENCE)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):  # each rank holds the whole report, the same as a notebook cell's
        assert f"rank {rank}: 1 gradients ln_f.weight [0, 1]" in done.stdout, done.stdout


def test_after_a_torchrun_job_hangs_its_traces_name_the_skipped_call(tmp_path):
    folder = tmp_path / "traces"
    done = _torchrun(tmp_path, HANG, str(folder))
    assert done.returncode != 0  # gloo's 5 s timeout ended the job
    mismatch = find_hang(read_traces(str(folder)))
    assert mismatch is not None, read_traces(str(folder))
    text = str(mismatch)  # call 2: rank 0's second 4-float all-reduce beside rank 1's 8-float one
    assert mismatch.index == 2 and "of 16 B" in text and "of 32 B" in text, text
    assert "job.py:11 (train)" in text, text  # the line rank 0 waited on
