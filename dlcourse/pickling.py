"""How functions, arguments and results travel between the notebook and the ranks (lesson 00).

cloudpickle sends a function defined in a notebook cell by value (its code and the globals it
uses), which plain pickle cannot. One addition: a module object travels by name. cloudpickle
takes a global such as `config` for the submodule `torch.distributed.config` when the function
also uses `dist`, and torch's config modules (a ModuleType subclass) cannot be pickled.
"""

import importlib
import io
import sys
import types

import cloudpickle


class _Pickler(cloudpickle.CloudPickler):
    def reducer_override(self, obj):
        if (isinstance(obj, types.ModuleType) and type(obj) is not types.ModuleType
                and sys.modules.get(obj.__name__) is obj):
            return importlib.import_module, (obj.__name__,)
        return super().reducer_override(obj)


def dumps(obj):
    buffer = io.BytesIO()
    _Pickler(buffer).dump(obj)
    return buffer.getvalue()


loads = cloudpickle.loads
