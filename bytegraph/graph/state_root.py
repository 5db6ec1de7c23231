"""The graph's state root: the module whose attributes a graph's ``get_attr`` nodes read (the
parameters and buffers the trace met, under unique flat names), and the ``GraphModule`` made
from it and the graph. Both skip ``nn.Module``'s per-attribute Python where no global
registration hook is installed: a deep model has hundreds of such tensors."""
import torch
import torch.fx as fx
from torch.fx.graph_module import _copy_attr
from torch.nn.modules import module as nn_module


def register_state(root, name, tensor, is_parameter):
    """``root.register_parameter``/``register_buffer``. A parameter whose name no attribute of
    ``root`` has, where no global registration hook is installed, is put in the table directly
    (what ``register_parameter`` ends with then; ~10 us each, a deep model has hundreds)."""
    if is_parameter and type(tensor) is torch.nn.Parameter and not nn_module._global_parameter_registration_hooks \
            and name not in root.__dict__ and not hasattr(type(root), name) and name not in root._parameters \
            and name not in root._buffers and name not in root._modules:
        root._parameters[name] = tensor
    elif is_parameter:
        root.register_parameter(name, tensor)
    else:
        root.register_buffer(name, tensor)


def graph_module(root, graph):
    """``fx.GraphModule(root, graph)``. GraphModule copies each attribute a node reads through
    ``Module.__setattr__`` (~25 us each, hundreds in a deep model); a flat name that only the
    root's tables hold, where no attribute of the new module is in the way, is put in the same
    table directly (what ``register_parameter``/``register_buffer``/``add_module`` end with when no
    global registration hook is installed); anything else is copied as GraphModule does."""
    gm = fx.GraphModule(root, fx.Graph())
    hooks = (nn_module._global_parameter_registration_hooks or nn_module._global_buffer_registration_hooks
             or nn_module._global_module_registration_hooks)
    cls = type(gm)
    copied = set()
    for node in graph.nodes:
        if node.op not in ("get_attr", "call_module"):
            continue
        target = node.target
        if target in copied:
            continue
        copied.add(target)
        if not hooks and "." not in target and not hasattr(cls, target) and target not in gm.__dict__:
            for table in ("_parameters", "_buffers", "_modules"):
                entries = root.__dict__[table]
                if target in entries and entries[target] is not None and target not in root.__dict__:
                    if table == "_buffers" and isinstance(entries[target], torch.nn.Parameter):
                        _copy_attr(root, gm, target)      # (GraphModule makes it a parameter)
                    else:
                        gm.__dict__[table][target] = entries[target]
                    break
            else:
                _copy_attr(root, gm, target)
        else:
            _copy_attr(root, gm, target)
    gm.graph = graph
    return gm


__all__ = ["graph_module", "register_state"]
