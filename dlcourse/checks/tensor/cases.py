"""The sizes and seeds lesson 04's checks draw from the `rng` that `core.fresh_cases` seeds
afresh on every run (a failure names the seed; `seed=` replays it)."""


def wide_seed(rng):
    """A seed for one tensor (`random_tensor`), one of 2**62: a rank that holds one tensor of a
    case cannot find it, and from it the case's other tensors, by trying seeds."""
    return rng.randrange(2**62)


def draw_tp_sizes(rng):
    """2, 3 and 4 in a random order: every run holds a tp that is not 4 (nor a power of 2)."""
    sizes = [2, 3, 4]
    rng.shuffle(sizes)
    return sizes
