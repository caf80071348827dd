"""What a rank's function returned, as data (lesson 00's launcher, `dlcourse grade`'s checks).

`launch_as_data` reads a rank's answer with `torch.load(weights_only=True)`, which builds
tensors, Python numbers, strings and bytes, and lists, tuples, dicts and sets of them, and
nothing else. A correct answer is often another plain type: a numpy integer from `np.cumsum`,
the tuple of numpy integers `np.unravel_index` gives, a `fractions.Fraction`, a numpy array.
`as_data` turns each into the Python type that means the same number (a numpy array into nested
lists, a Fraction into a float), in the rank, before it is sent; anything else is left as it is,
and refused by the loader with `kind` naming it.
"""

import io
import numbers

import torch


def as_data(value):
    """`value` with every plain number or numpy array in it as Python data; other objects as
    they are. A list, tuple, dict or set is rebuilt with its items converted (a named tuple as a
    plain tuple, an OrderedDict as a dict, a frozenset as a set); a tensor or a torch.Size is
    data already."""
    if isinstance(value, (torch.Tensor, torch.Size)) or value is None:
        return value
    if isinstance(value, (str, bytes)):
        return str(value) if isinstance(value, str) else bytes(value)
    if _from_numpy(value):  # an array (nested lists) or a numpy scalar (a Python number)
        return as_data(value.tolist())
    if isinstance(value, bool):
        return value
    for abc, plain in ((numbers.Integral, int), (numbers.Real, float), (numbers.Complex, complex)):
        if isinstance(value, abc):
            return plain(value)  # a Fraction becomes the float nearest it
    if isinstance(value, (list, tuple)):
        return (list if isinstance(value, list) else tuple)(as_data(item) for item in value)
    if isinstance(value, (set, frozenset)):  # a frozenset as a set: torch reads no frozensets
        return {as_data(item) for item in value}
    if isinstance(value, dict):
        return {as_data(k): as_data(v) for k, v in value.items()}
    return value


def _from_numpy(value):
    return type(value).__module__ == "numpy" and hasattr(value, "tolist")


def saved(value):
    """`value` as torch.save writes it."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def loads_as_data(payload):
    """Read what `saved` wrote as the parent of a `launch_as_data` rank does."""
    return torch.load(io.BytesIO(payload), weights_only=True)


ONLY_DATA = ("but this launch reads only data. Return tensors, numbers (numpy's and Fractions "
             "too), strings, or lists, tuples, dicts and sets of them.")


def not_data(value):
    """None where `value` travels as data; else what it is ('a Foo', `kind`)."""
    try:
        loads_as_data(saved(value))
        return None
    except Exception:
        return kind(value)


def kind(value):
    """'a Foo', or for a container, the first thing inside it that is not data."""
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        for item in (value.values() if isinstance(value, dict) else value):
            try:
                loads_as_data(saved(item))
            except Exception:
                return f"a {type(value).__name__} holding {kind(item)}"
    return f"a {type(value).__module__}.{type(value).__qualname__}".replace(" builtins.", " ")
