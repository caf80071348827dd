"""The rank grid: how many ranks each strategy's axis has, and which ranks share a group on it
(lessons 04-08; lesson 07, `lessons/07_combining.ipynb`, draws it).

A job of world_size = pp x dp x cp x tp ranks is a grid. Each rank has one coordinate per axis,
and on each axis it talks only to the ranks that differ from it in that coordinate alone: its
tensor-parallel group, its context-parallel group (lesson 08), its data-parallel group, its
pipeline neighbours. `RankGrid` holds the sizes and checks them; `RankGrid.new_groups()`, called
once on every rank, makes the process groups and returns them as a `RankGroups` that the program
hands to each strategy (`groups.tp`, `groups.cp`, `groups.dp`, `groups.dp_cp`). Nothing here is
module-level state: a notebook cell that builds a second grid gets its own groups.

The order of the axes, outermost first, decides which ranks are neighbours. The default
("pp", "dp", "cp", "tp") puts tp innermost: tensor-parallel ranks are consecutive, so on a real
cluster they share a node and its fast links. cp comes next: its ring passes K and V every
layer, more often than dp's once-a-step gradients. This is Megatron-LM's order (its default
"tp-cp-ep-dp-pp", innermost first, in `parallel_state.initialize_model_parallel`; ep is lesson
09's) and torchtitan's mesh ("pp", "dp_replicate", "dp_shard", "cp", "tp"). A grid with cp = 1
leaves cp out of its default order, so the three-axis grids of lessons 04-07 are what they were;
an `order` may leave cp out when cp = 1.

`RankGrid` is the one description of a job's layout: the runtime (`combine.GridPlan`) and the
planner (`dlcourse.planner.layouts.Layout.grid`) both hold one, and both check it against the
one rule book, `dlcourse.parallel.rules.problems`. `virtual` is the pipeline's model chunks
per rank (interleaved 1F1B, lesson 06): not an axis of ranks, but a rule-book size (whole
layers per virtual stage), like torchtitan's `ParallelDims` beside its pipeline schedule.

The expert axis (lesson 09). `ep` is not a fifth factor of the world size: the experts of an MoE
layer are dealt out over ranks the dense layers already use. torchtitan (pytorch/torchtitan
b5bcd76, 2026-08-21, torchtitan/distributed/parallel_dims.py) borrows them from dp_shard x cp x
tp ("expert_parallel_degree must divide dp_shard * cp * tp") and keeps each expert whole on its
rank (its sparse mesh ("pp", "dp_replicate", "efsdp", "ep"), efsdp = dp_shard x cp x tp / ep).
The grid follows it, with its one dp axis for dp_replicate x dp_shard: ep divides dp x cp x tp,
each rank holds E / ep whole experts (`experts_per_rank`), and the ranks holding the same experts
form the expert-data-parallel group of dp x cp x tp / ep ranks (`expert_data_parallel`), over
which the experts' gradients are reduced and ZeRO shards their state, as lesson 09's
`dlcourse.parallel.expert.groups` does with tp = cp = 1. The rule book has its rows; the
runtime's combined grid does not build the axis (lesson 09 runs it over data parallel alone).

The dp x cp replicas. Every cp rank holds the same weights and trains them on its part of each
sequence, so the gradients are averaged over dp x cp ranks, not dp alone: `groups.dp_cp`, the
ranks that differ only on dp and cp (Megatron-LM's data-parallel group "with context parallel";
torchtitan flattens the same two mesh axes into "dp_cp", and FSDP shards over "dp_shard_cp").
It is made only when both dp > 1 and cp > 1; otherwise it is the dp or the cp group itself,
which holds the same ranks.
"""

import itertools
from dataclasses import dataclass, field

import torch.distributed as dist

from dlcourse.parallel.rules import Run, refuse

AXES = ("pp", "dp", "cp", "tp")
FLATTENED = {"dp_cp": ("dp", "cp")}  # a group over two axes: the ranks that share the weights


@dataclass(frozen=True)
class RankGrid:
    dp: int = 1  # data-parallel replicas (ZeRO shards its state over them, x cp with cp > 1)
    tp: int = 1  # tensor-parallel ranks: each holds 1/tp of every weight matrix
    pp: int = 1  # pipeline stages: each holds a run of consecutive layers
    cp: int = 1  # context-parallel ranks: each holds 1/cp of every sequence (lesson 08)
    order: tuple = None  # the axes outermost first (the last one's ranks are consecutive);
    #                      default AXES, without cp when cp = 1
    virtual: int = 1  # v: model chunks (virtual stages) per pipeline rank, interleaved 1F1B
    ep: int = 1  # expert-parallel ranks, borrowed from dp x cp x tp: each holds E/ep experts

    def __post_init__(self):
        for axis in AXES + ("virtual", "ep"):
            size = getattr(self, axis)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"RankGrid.{axis} must be a whole number >= 1, got {size!r}")
        three = tuple(a for a in AXES if a != "cp")  # lessons 04-07's grid, valid with cp = 1
        order = self.order or (AXES if self.cp > 1 else three)
        if sorted(order) not in (sorted(AXES), sorted(three) if self.cp == 1 else None):
            raise ValueError(f"RankGrid.order must name each of {AXES} once (cp may be left "
                             f"out when cp = 1), got {self.order!r}")
        object.__setattr__(self, "order", tuple(order))

    @property
    def world_size(self):
        return self.pp * self.dp * self.cp * self.tp

    @property
    def expert_region(self):
        """Ranks of one pipeline stage: dp x cp x tp, those ep borrows from (torchtitan's
        dp_shard x cp x tp, with dp_replicate folded into dp)."""
        return self.dp * self.cp * self.tp

    @property
    def expert_data_parallel(self):
        """Ranks that hold the same experts (torchtitan's dp_replicate x efsdp): the experts'
        gradients are reduced, and their ZeRO state sharded, over these. The rule book
        refuses an ep that does not divide `expert_region`."""
        return self.expert_region // self.ep

    def experts_per_rank(self, n_experts):
        """E / ep whole experts of each MoE layer on every rank (the rule book refuses an ep
        that does not divide E)."""
        return n_experts // self.ep

    @property
    def shape(self):
        """The grid's sizes in `order`: rank r sits at index r of a C-ordered array this shape."""
        return tuple(getattr(self, axis) for axis in self.order)

    def coords(self, rank):
        """rank -> {axis: coordinate} for each axis of `order`, the rank's place in the grid."""
        self._check_rank(rank)
        coords = {}
        for axis, size in zip(reversed(self.order), reversed(self.shape)):
            rank, coords[axis] = divmod(rank, size)  # innermost axis varies fastest
        return {axis: coords[axis] for axis in self.order}

    def rank_of(self, coords):
        """{axis: coordinate} -> rank (the inverse of `coords`)."""
        rank = 0
        for axis, size in zip(self.order, self.shape):
            rank = rank * size + coords[axis]
        return rank

    def axis_ranks(self, axis, rank):
        """The ranks in `rank`'s group on `axis`: those equal to it on every other axis.
        "dp_cp" (`FLATTENED`) is the group of both axes: those equal to it but on dp and cp."""
        axes = self._check_axis(axis)
        here = self.coords(rank)
        return sorted(self.rank_of({**here, **dict(zip(axes, at))})
                      for at in itertools.product(*(range(getattr(self, a)) for a in axes)))

    def axis_groups(self, axis):
        """Every group of `axis`, each a list of ranks; together they hold each rank once."""
        axes = self._check_axis(axis)
        firsts = [r for r in range(self.world_size)
                  if all(self.coords(r).get(a, 0) == 0 for a in axes)]
        return [self.axis_ranks(axis, r) for r in firsts]

    def check_world_size(self, world_size):
        if world_size != self.world_size:
            sizes = " x ".join(f"{axis} {getattr(self, axis)}" for axis in self.order)
            raise ValueError(
                f"the grid {sizes} = {self.world_size} ranks, but the job has {world_size}: "
                "make the product equal the world size")

    def check_model(self, config, micro_batches=None):
        """Refuse sizes the course GPT (a `GPTConfig`) cannot be cut into, with the arithmetic:
        the first sentence of the rule book (`dlcourse.parallel.rules.problems`) that the planner
        reads too. micro_batches None: not checked."""
        m = self.pp if micro_batches is None else micro_batches
        refuse(self, config, Run(micro_batches=m))

    def new_groups(self):
        """On every rank of the job, once: make every axis's process groups (each rank must
        create every group, in the same order) and return this rank's as a `RankGroups`.
        "dp_cp" gets groups of its own only when dp > 1 and cp > 1; otherwise its ranks are
        those of the dp group (cp = 1) or of the cp group (dp = 1), and it is that group."""
        self.check_world_size(dist.get_world_size())
        rank = dist.get_rank()
        mine = {}
        both = self.dp > 1 and self.cp > 1
        for axis in self.order + tuple(a for a in AXES if a not in self.order) + \
                (("dp_cp",) if both else ()):
            for ranks in self.axis_groups(axis):
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine[axis] = group
        if not both:
            mine["dp_cp"] = mine["dp"] if self.cp == 1 else mine["cp"]
        return RankGroups(self, rank, self.coords(rank), mine)

    def _check_rank(self, rank):
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the grid's {self.world_size} ranks")

    def _check_axis(self, axis):
        """The grid axes that `axis` names: (axis,), or both of a `FLATTENED` one."""
        if axis in AXES:
            return (axis,)
        if axis in FLATTENED:
            return FLATTENED[axis]
        raise ValueError(f"unknown axis {axis!r}; the axes are {AXES} and {tuple(FLATTENED)}")


def _axis_group(axis, doc=None):
    """A read-only attribute of RankGroups: the process group of `axis`."""
    doc = doc or f"The process group of the {axis} axis: the ranks this one talks to on it."
    return property(lambda self: self.groups[axis], doc=doc)


@dataclass
class RankGroups:
    """One rank's view of the grid: where it sits and the process group of each axis."""

    grid: RankGrid
    rank: int
    coords: dict  # {axis: this rank's coordinate}
    groups: dict = field(repr=False)  # {axis: ProcessGroup of the ranks this one talks to on it}

    # groups.dp, groups.tp, ...: the process group of each axis, and of the flattened dp x cp
    dp, tp, pp, cp = (_axis_group(axis) for axis in ("dp", "tp", "pp", "cp"))
    dp_cp = _axis_group("dp_cp", "The ranks that hold the same weights: gradients are averaged "
                                 "over dp x cp.")

