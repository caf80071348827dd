"""Issue 28: data moved from rank to rank another way than collectives or send/recv fails. The
c10d store (the default group's, or a TCPStore of the student's) refuses to be used while a
student's function runs (`refuse.no_store`); what is moved another way still (a file every
rank can read) is caught by counting the bytes a correct answer must move: the exchange sends
and receives its tensor through send/recv, the vocabulary-parallel loss all-reduces at least
two numbers a token. Issue 36: under `dlcourse grade` a file is no channel at all, each rank
having a /tmp and /dev/shm of its own (`dlcourse/grading/rank_sandbox.py`)."""

import glob
import itertools
import os
import pickle
import random
import shutil
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

from checking import first_line_and_hint
from dlcourse import pickling
from dlcourse.checks.context import check_seq_to_heads
from dlcourse.checks.core import Submitted, run_on_ranks
from dlcourse.checks.core.ranks import WIRE_FLOOR
from dlcourse.checks.expert import dispatch_to_experts
from dlcourse.checks.expert import check_dispatch_to_experts
from dlcourse.checks.pipeline import check_exchange
from dlcourse.checks.tensor import check_vocab_parallel_cross_entropy
from dlcourse.grading import rank_sandbox

SHARED = tempfile.mkdtemp(prefix="dlcourse-side-")  # a folder every rank can read


@pytest.fixture(autouse=True, scope="module")
def _remove_shared():
    """The shared folder, and what the self-check's cheats wrote to the real /tmp and /dev/shm
    (a graded rank's were its own, gone with its sandbox)."""
    yield
    shutil.rmtree(SHARED, ignore_errors=True)
    for kind in ("leak", "block", "dispatch"):
        for path in glob.glob(f"/tmp/dlcourse-{kind}-*") + glob.glob(f"/dev/shm/dlcourse-{kind}-*"):
            os.remove(path)


def _store():
    return dist.distributed_c10d._get_default_store()


def exchange_through_the_store(tensor, peer, group):
    me = dist.get_rank()
    _store().set(f"{me}->{peer}", pickle.dumps(tensor))
    return pickle.loads(_store().get(f"{peer}->{me}"))


def exchange_through_a_store_of_its_own(tensor, peer, group):
    me, port = dist.get_rank(), 29000 + os.getppid() % 20000  # the ranks' forkserver: shared
    store = dist.TCPStore("127.0.0.1", port, dist.get_world_size(), is_master=me == 0)
    store.set(f"{me}->{peer}", pickle.dumps(tensor))
    return pickle.loads(store.get(f"{peer}->{me}"))


def _put(name, value):
    path = os.path.join(SHARED, name)
    with open(path + ".part", "wb") as f:
        pickle.dump(value, f)
    os.replace(path + ".part", path)  # whole or not at all


def _take(name, delete=True):
    path = os.path.join(SHARED, name)
    while not os.path.exists(path):
        time.sleep(0.005)
    with open(path, "rb") as f:
        value = pickle.load(f)
    if delete:
        os.remove(path)
    return value


def exchange_through_a_file(tensor, peer, group):
    me, case = dist.get_rank(), f"{os.getppid()}-{dist.get_world_size()}-{tuple(tensor.shape)}"
    _put(f"{case}-{me}-{peer}", tensor)
    return _take(f"{case}-{peer}-{me}")


def _stats(logits, targets, group):
    """This rank's (row max, which targets it holds, their logits (0 elsewhere))."""
    v = logits.shape[1]
    local = targets - dist.get_rank(group) * v
    held = (local >= 0) & (local < v)
    m = logits.detach().max(dim=1).values
    picked = logits.gather(1, local.clamp(0, v - 1)[:, None])[:, 0] * held
    return m, held, picked


def _loss(logits, m_all, s_others, t_others, held, picked):
    """The mean cross-entropy, differentiable in this rank's logits: log of the whole sum of
    exp (this rank's, plus the others' as numbers), less the target's logit."""
    s_mine = torch.exp(logits - m_all[:, None]).sum(dim=1)
    target = torch.where(held, picked, t_others)
    return (torch.log(s_mine + s_others) + m_all - target).mean()


def _sum_exp(entry, m_all):
    """A rank's sum of exp(logit - its max), rescaled to the whole max."""
    return entry[3] * torch.exp(entry[0] - m_all)


def _with_sums(logits, stats):
    """`stats` and this rank's sum of exp(logit - its own max)."""
    return (*stats, torch.exp(logits.detach() - stats[0][:, None]).sum(dim=1))


def _by_store(rank, tp, stats, targets):
    _store().set(f"loss-{rank}", pickle.dumps(stats))
    return [pickle.loads(_store().get(f"loss-{r}")) for r in range(tp)]


def _by_file(rank, tp, stats, targets):
    case = f"{os.getppid()}-{tp}-{hash(tuple(targets.tolist()))}"
    _put(f"{case}-{rank}", stats)
    return [_take(f"{case}-{r}", delete=False) for r in range(tp)]


def loss_channel(channel):
    def loss(logits, targets, group):
        tp, rank = dist.get_world_size(group), dist.get_rank(group)
        m, held, picked = _stats(logits, targets, group)
        stats = _with_sums(logits, (m, held, picked.detach()))
        everyone = channel(rank, tp, stats, targets)
        m_all = torch.stack([e[0] for e in everyone]).max(dim=0).values
        s_others = sum(_sum_exp(e, m_all) for r, e in enumerate(everyone) if r != rank)
        t_others = sum(e[2] for r, e in enumerate(everyone) if r != rank)
        return _loss(logits, m_all, s_others, t_others, held, picked)
    return loss


def test_an_exchange_through_the_c10d_store_fails():
    first, _ = first_line_and_hint(check_exchange, exchange_through_the_store)
    assert "used the c10d store (Store.set), which this exercise does not allow" in first, first
    first, _ = first_line_and_hint(check_exchange, exchange_through_a_store_of_its_own)
    assert "used the c10d store (a new TCPStore), which this exercise" in first, first


def test_an_exchange_through_a_file_fails_on_the_bytes_it_did_not_send():
    first, _ = first_line_and_hint(check_exchange, exchange_through_a_file)
    assert "sent 0 bytes through send in the exchange with rank" in first, first


def test_the_vocabulary_parallel_loss_through_the_store_or_a_file_fails():
    first, _ = first_line_and_hint(check_vocab_parallel_cross_entropy, loss_channel(_by_store))
    assert "used the c10d store (Store.set)" in first, first
    first, _ = first_line_and_hint(check_vocab_parallel_cross_entropy, loss_channel(_by_file))
    assert "moved 0 bytes in 0 collectives, less than" in first, first


# Issue 36: under `dlcourse grade` each rank has its own /tmp and /dev/shm, so a file one rank
# writes is not there for another. The answer below moves the right bytes (zeros, through one
# all-to-all), so no count catches it: only the sandbox can.

FOLDERS = ("/tmp", "/dev/shm")


def _take_from_either(name, end):
    """A file of that name in /tmp or /dev/shm, waited for until `end`; None if it never comes."""
    while time.monotonic() < end:
        for folder in FOLDERS:
            if os.path.exists(f"{folder}/{name}"):
                time.sleep(0.05)  # written whole by then
                return torch.load(f"{folder}/{name}")
        time.sleep(0.01)
    return None


def seq_to_heads_through_files(x, group):
    cp = dist.get_world_size(group)
    zeros = [torch.zeros_like(h).contiguous() for h in x.chunk(cp, dim=1)]
    dist.all_to_all([torch.empty_like(z) for z in zeros], zeros, group=group)  # the bytes
    return _from_files(x, group)


def _from_files(x, group):
    cp, me = dist.get_world_size(group), dist.get_rank(group)
    name = f"dlcourse-leak-{os.environ['MASTER_PORT']}-{{}}.pt"  # one rendezvous port a launch
    torch.save(x, f"{FOLDERS[me % 2]}/{name.format(me)}")
    end = time.monotonic() + 3.0  # well within the check's 10 s
    shards = [_take_from_either(name.format(r), end) for r in range(cp)]
    if any(s is None for s in shards):  # another rank's file never came
        return torch.zeros_like(torch.cat([x] * cp, dim=2).chunk(cp, dim=1)[me])
    return torch.cat(shards, dim=2).chunk(cp, dim=1)[me]


def seq_to_heads(x, group):
    cp = dist.get_world_size(group)
    pieces = [h.contiguous() for h in x.chunk(cp, dim=1)]
    received = [torch.empty_like(p) for p in pieces]
    dist.all_to_all(received, pieces, group=group)
    return torch.cat(received, dim=2)


@pytest.mark.skipif(not rank_sandbox.works(), reason="no user namespaces here")
def test_a_file_one_rank_writes_is_not_there_for_another_under_grading():
    check_seq_to_heads(seq_to_heads_through_files)  # the notebook's self-check: one /tmp, passes
    first, _ = first_line_and_hint(check_seq_to_heads, Submitted(
        "seq_to_heads", pickling.dumps(seq_to_heads_through_files)))
    assert first.startswith("seq_to_heads on ") and "values that are in no slot" in first, first
    check_seq_to_heads(Submitted("seq_to_heads", pickling.dumps(seq_to_heads)))  # 2-5 ranks


# Issue 36: bounded from below too, and counted where the student's code cannot reach. A rank
# must pass its 4 KiB block on to the next; the answer below takes it from a file instead (one
# machine in the self-check: the file channel works), sends one element, and fakes its
# CommCounter's records to show the whole block sent. The kernel's count of what each rank
# received (`run_on_ranks(receives=)`, `dlcourse/grading/wire.py`) is not the rank's to change.

def _pass_on(student, block):
    from dlcourse.collectives.counter import CommCounter
    with CommCounter() as comm:
        got = student(block)
    return got, sum(r.nbytes for r in comm.records)


def pass_on(block):
    me, world = dist.get_rank(), dist.get_world_size()
    got = torch.empty_like(block)
    ops = [dist.P2POp(dist.isend, block, (me + 1) % world),
           dist.P2POp(dist.irecv, got, (me - 1) % world)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return got


def pass_on_by_file_and_a_token(block):
    from dlcourse.collectives import counter
    me, world = dist.get_rank(), dist.get_world_size()
    real_exit = counter.CommCounter.__exit__

    def faked(self, *exc):  # the records an honest send would leave
        real_exit(self, *exc)
        nbytes = block.numel() * block.element_size()
        self.records[:] = [counter.CommRecord("send", nbytes, 2),
                           counter.CommRecord("recv", nbytes, 2)]
    counter.CommCounter.__exit__ = faked
    got = pass_on(block[:1].clone())  # a token
    name = f"dlcourse-block-{os.environ['MASTER_PORT']}-{{}}.pt"
    torch.save(block, f"/tmp/{name.format(me)}")
    end = time.monotonic() + 3.0
    while not os.path.exists(f"/tmp/{name.format((me - 1) % world)}") and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.05)
    return torch.load(f"/tmp/{name.format((me - 1) % world)}") if got is not None else None


def _run_pass_on(fn, world=3):
    blocks = [torch.full((1024,), float(r)) for r in range(world)]  # 4 KiB each
    must = [blocks[0].numel() * blocks[0].element_size()] * world
    return run_on_ranks(fn, [(b,) for b in blocks], exercise="pass_on", harness=_pass_on,
                        receives=must)


def test_a_token_message_with_a_faked_counter_fails_on_the_bytes_counted_outside():
    for rank, ((got, counted), _) in enumerate(_run_pass_on(pass_on)):  # honest: passes
        assert torch.equal(got, torch.full((1024,), float((rank - 1) % 3)))
        assert counted == 2 * 4096  # sent and received
    first, _ = first_line_and_hint(_run_pass_on, pass_on_by_file_and_a_token)
    assert first.startswith("pass_on: rank 0 received ") and "at least 4096" in first, first


# Issue 36: a floor that holds for small messages. The kernel counts gloo's headers as well,
# ~144 B a message a peer, so where a case's rank must receive a few bytes a token message
# meets its floor; each check has a case of 2 KiB or more from each rank to each other
# (`core.ranks.WIRE_FLOOR`).
# Below, the data comes by file (the self-check's one /tmp) and only a token, or the counts, by
# all-to-all: a small case may pass (its rows, or its tokens, weigh less than the headers), the
# wide one fails on what its ranks received, whatever the draw.

def seq_to_heads_by_file_and_a_token(x, group):
    cp = dist.get_world_size(group)
    token = [torch.zeros(1, dtype=x.dtype) for _ in range(cp)]  # one value a peer
    dist.all_to_all([torch.empty_like(t) for t in token], token, group=group)
    return _from_files(x, group)


def dispatch_by_file_and_the_counts(x, experts, n_experts, group):
    ep, me = dist.get_world_size(group), dist.get_rank(group)
    n_local = n_experts // ep
    counts = torch.bincount(experts, minlength=n_experts)  # (E,) this rank's rows per expert
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts, group=group)  # rank s's counts of my experts, honestly
    name = f"dlcourse-dispatch-{os.environ['MASTER_PORT']}-{{}}.pt"
    torch.save((x, experts), f"/tmp/{name.format(me)}")
    end = time.monotonic() + 3.0
    while time.monotonic() < end and not all(os.path.exists(f"/tmp/{name.format(s)}")
                                             for s in range(ep)):
        time.sleep(0.01)
    time.sleep(0.05)  # written whole by then
    rows = []
    for s in range(ep):  # by source rank, then local expert, then order on the source
        xs, es = torch.load(f"/tmp/{name.format(s)}")
        rows += [xs[es == me * n_local + j] for j in range(n_local)]
    return torch.cat(rows), got.view(ep, n_local)


@pytest.mark.parametrize("check, cheat", [
    (check_seq_to_heads, seq_to_heads_by_file_and_a_token),
    (check_dispatch_to_experts, dispatch_by_file_and_the_counts)], ids=["ulysses", "dispatch"])
def test_data_by_file_and_a_token_message_fails_on_the_wide_case(check, cheat):
    first, _ = first_line_and_hint(check, cheat)
    assert " received " in first and "(counted on its connections, outside its process)" \
        in first, first


def test_dispatch_s_wide_case_sends_wire_floor_bytes_or_more_from_each_rank_to_each():
    for seed in range(20):
        rng = random.Random(seed)
        ep = rng.choice([2, 3, 4])
        xs, experts, n_experts = dispatch_to_experts._draw_case(ep, rng, idle_rank=False, wide=True)
        n_local = n_experts // ep
        for s, r in itertools.product(range(ep), repeat=2):  # rank s's rows to rank r's experts
            rows = int((experts[s] // n_local == r).sum())  # its own too: see the next test
            assert rows * xs[s].size(1) * xs[s].element_size() >= WIRE_FLOOR, (seed, s, r)


# Issue 36: efficiency faked. Every rank sends its whole input to every rank (an all-gather where
# an all-to-all belongs), keeps its part, and clears the check's CommCounter records, so the
# bytes it says it sent are none. The kernel's count of what each rank received, the same in the
# self-check and graded, is above the exercise's data and a few headers in the wide case
# (`run_on_ranks(receives_at_most=)`).

def _clear_the_counters():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    for mode in _get_current_dispatch_mode_stack():
        getattr(mode, "records", []).clear()


def seq_to_heads_all_gathered(x, group):
    cp, me = dist.get_world_size(group), dist.get_rank(group)
    whole = [torch.empty_like(x) for _ in range(cp)]
    dist.all_to_all(whole, [x.contiguous()] * cp, group=group)  # every rank's whole x
    _clear_the_counters()
    return torch.cat(whole, dim=2).chunk(cp, dim=1)[me].contiguous()


def _to_every_rank(t, group):
    """Every rank's t, concatenated in rank order (sent to every rank whole)."""
    ep = dist.get_world_size(group)
    n = torch.tensor([len(t)] * ep)
    theirs = torch.empty_like(n)
    dist.all_to_all_single(theirs, n, group=group)
    out = t.new_empty((int(theirs.sum()), *t.shape[1:]))
    dist.all_to_all_single(out, t.repeat(ep, *[1] * (t.dim() - 1)), theirs.tolist(),
                           [len(t)] * ep, group=group)
    return list(out.split(theirs.tolist()))


def dispatch_to_every_rank(x, experts, n_experts, group):
    ep, me = dist.get_world_size(group), dist.get_rank(group)
    n_local = n_experts // ep
    xs, es = _to_every_rank(x, group), _to_every_rank(experts, group)
    _clear_the_counters()
    rows = [xs[s][es[s] == me * n_local + j] for s in range(ep) for j in range(n_local)]
    counts = [[int((es[s] == me * n_local + j).sum()) for j in range(n_local)]
              for s in range(ep)]
    return torch.cat(rows), torch.tensor(counts)


@pytest.mark.parametrize("check, cheat, name", [
    (check_seq_to_heads, seq_to_heads_all_gathered, "seq_to_heads"),
    (check_dispatch_to_experts, dispatch_to_every_rank, "dispatch_to_experts")],
    ids=["ulysses", "dispatch"])
def test_an_all_gather_with_its_records_cleared_fails_on_the_bytes_received(check, cheat, name):
    for fn in (cheat, Submitted(name, pickling.dumps(cheat))):  # self-check, then graded
        first, _ = first_line_and_hint(check, fn)
        assert " received " in first and "at most" in first, first
