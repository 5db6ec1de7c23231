"""Gradients that eager leaves as ``None`` stay ``None`` through AOTAutograd.

AOTAutograd turns a graph into one autograd node whose backward computes a
gradient for every input that requires grad from the gradients of all the
outputs, filling the outputs the loss does not use with zeros. So a parameter
that only reaches an output outside the loss gets ``.grad`` full of zeros
where eager leaves it ``None`` (optimizers treat the two differently: AdamW
decays and steps a zero gradient, it skips a ``None`` one).

Eager's rule is connectivity: an input gets a gradient when the loss reaches
it through the autograd graph. Here that is worked out once per graph, at
compile time, from the autograd graphs the tracer's fake tensors already
carry (each node's ``example_value``): for every input that requires grad,
the graph outputs it reaches. Only when some input reaches a strict part of
the differentiable outputs (or none of them) does anything happen at run
time: each call registers a post hook on AOTAutograd's backward node, which
sees which of that node's outputs actually received a gradient (autograd
passes ``None`` before filling zeros) and drops the gradients of inputs
none of whose outputs did. Graphs whose inputs all reach all outputs (a
training step returning its loss) are returned unchanged: no per-call cost.

The node's output slots and input edges are matched to the graph's outputs
and inputs on the first call that builds an autograd graph; whatever cannot
be matched is left as AOTAutograd made it (a zero gradient, never a wrong
one): a gradient arriving at a slot no graph output was matched to turns the
hook off for that backward.
"""
import torch

_NODE_NAME = "CompiledFunctionBackward"   # the class AOTAutograd makes for its autograd node
_WALK_DEPTH = 4     # autograd nodes AOTAutograd may put after its own one (regenerated views)


class Plan:
    """What the graph says about gradients.

    ``gated``: (placeholder position or None, parameter or None, frozenset of output
    positions it reaches) for each input that does not reach every differentiable output;
    ``differentiable``: the output positions that require grad; ``params``: every parameter
    of the graph that requires grad (their autograd edges bound the search for the node).
    """
    __slots__ = ("gated", "differentiable", "params")

    def __init__(self, gated, differentiable, params):
        self.gated = gated
        self.differentiable = differentiable
        self.params = params


def plan(gm):
    """The Plan for ``gm`` (outputs already a flat tuple), or None when every gradient eager
    computes is also exactly what AOTAutograd computes (or the graph carries no fake values)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output_node = gm.graph.output_node()
    (outs,) = output_node.args
    # Each input that needs grad, keyed by its autograd edge on the fake tensors.
    by_edge = {}
    inputs = []   # (placeholder position, parameter, fake)
    for pos, node in enumerate(placeholders):
        fake = node.meta.get("example_value")
        if fake is None and node.users:
            return None
        if isinstance(fake, torch.Tensor) and fake.requires_grad:
            inputs.append((pos, None, fake))
    seen_params = set()
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        fake = node.meta.get("example_value")
        if not isinstance(fake, torch.Tensor) or not fake.requires_grad or id(fake) in seen_params:
            continue
        seen_params.add(id(fake))
        param = _attr(gm, node.target)
        if not isinstance(param, torch.Tensor) or not param.requires_grad:
            return None
        inputs.append((None, param, fake))
    if not inputs:
        return None
    alive = []    # autograd node wrappers whose ids are keys: kept alive so no id is reused
    for i, (_, _, fake) in enumerate(inputs):
        edge = torch.autograd.graph.get_gradient_edge(fake)
        alive.append(edge.node)
        by_edge.setdefault((id(edge.node), edge.output_nr), []).append(i)

    differentiable = []
    reached = [set() for _ in inputs]
    for j, out in enumerate(outs):
        if not isinstance(out, torch.fx.Node):
            continue
        fake = out.meta.get("example_value")
        if not isinstance(fake, torch.Tensor) or not fake.requires_grad:
            continue
        differentiable.append(j)
        for i in _reached_inputs(fake, by_edge):
            reached[i].add(j)
    if not differentiable:
        return None
    every = frozenset(differentiable)
    gated = [(pos, param, frozenset(r)) for (pos, param, _), r in zip(inputs, reached) if r != every]
    if not gated:
        return None
    return Plan(gated, sorted(every), [param for _, param, _ in inputs if param is not None])


def _attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _reached_inputs(fake, by_edge):
    """Indices of the inputs whose autograd edges the fake tensor's history reaches."""
    edge = torch.autograd.graph.get_gradient_edge(fake)
    found = set()
    stack = [(edge.node, edge.output_nr)]
    seen = set()
    alive = []    # the node wrappers stay alive while their ids are in ``seen``
    while stack:
        node, nr = stack.pop()
        if node is None:
            continue
        hit = by_edge.get((id(node), nr))
        if hit is not None:
            found.update(hit)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        alive.append(node)
        stack.extend(node.next_functions)
    return found


def gate(compiled, plan):
    """Wrap ``compiled`` (positional inputs -> flat outputs) so that the gradients ``plan`` names
    are dropped in the backwards where eager would not compute them."""
    if plan is None:
        return compiled
    state = _Matching(plan)

    def run(*args):
        outs = compiled(*args)
        hook = state.hook
        if hook is not None:
            grad_fn = outs[state.output].grad_fn
            if type(grad_fn) is state.node_type:
                grad_fn.register_hook(hook)
        elif state.pending and torch.is_grad_enabled():
            state.match(args, outs)
        return outs

    run.__wrapped__ = compiled
    return run


class _Matching:
    """Matches AOTAutograd's node to the graph's inputs and outputs on the first call with grads."""

    def __init__(self, plan):
        self.plan = plan
        self.pending = True
        self.hook = None
        self.output = None        # an output whose grad_fn is the node itself
        self.node_type = None

    def match(self, args, outs):
        plan = self.plan
        # The search for AOTAutograd's node stops at the autograd edges of the graph's inputs,
        # so that a node of an earlier graph behind an input is never taken for this one.
        stop = set()
        alive = []
        for t in list(args) + plan.params:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                e = torch.autograd.graph.get_gradient_edge(t)
                alive.append(e.node)
                stop.add((id(e.node), e.output_nr))
        node = None
        slots = {}
        for j in plan.differentiable:
            out = outs[j] if j < len(outs) else None
            if not isinstance(out, torch.Tensor) or out.grad_fn is None:
                continue
            for n, nr in _node_slots(out, stop):
                if node is None:
                    node = n
                elif n is not node:
                    self.pending = False     # two nodes of AOTAutograd's: leave it alone
                    return
                slots.setdefault(j, set()).add(nr)
        if node is None:
            return        # no autograd graph in this call; try again on the next
        self.pending = False
        self.output = next((j for j in plan.differentiable
                            if j < len(outs) and isinstance(outs[j], torch.Tensor) and outs[j].grad_fn is node),
                           None)
        if self.output is None:
            return
        next_functions = node.next_functions
        gated = []
        for pos, param, reached in plan.gated:
            t = args[pos] if pos is not None else param
            if not isinstance(t, torch.Tensor) or not t.requires_grad:
                continue
            e = torch.autograd.graph.get_gradient_edge(t)
            from_slots = frozenset(s for j in reached for s in slots.get(j, ()))
            for k, (n, nr) in enumerate(next_functions):
                if n is e.node and nr == e.output_nr:
                    gated.append((k, from_slots))
        if not gated:
            return
        known = frozenset(s for ss in slots.values() for s in ss)
        self.node_type = type(node)
        self.hook = _make_hook(tuple(gated), known)
        node.register_hook(self.hook)


def _node_slots(out, stop):
    """(node, output index) of AOTAutograd's node reached from ``out`` within a few steps."""
    found = []
    frontier = [(out.grad_fn, out.output_nr)]
    for _ in range(_WALK_DEPTH):
        nxt = []
        for n, nr in frontier:
            if n is None or (id(n), nr) in stop:
                continue
            if type(n).__name__ == _NODE_NAME:
                found.append((n, nr))
                continue
            nxt.extend(n.next_functions)
        frontier = nxt
    return found


def _make_hook(gated, known):
    def drop_unreached(grad_inputs, grad_outputs):
        for s, g in enumerate(grad_outputs):
            if g is not None and s not in known:
                return None      # a gradient we cannot place: keep AOTAutograd's answer
        changed = None
        for k, slots in gated:
            if grad_inputs[k] is None:
                continue
            for s in slots:
                if grad_outputs[s] is not None:
                    break
            else:
                if changed is None:
                    changed = list(grad_inputs)
                changed[k] = None
        return None if changed is None else tuple(changed)

    return drop_unreached
