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
the graph outputs it reaches. Each call with gradients registers a post hook
on AOTAutograd's backward node, which sees which of that node's outputs
actually received a gradient (autograd passes ``None`` before filling zeros)
and drops the gradients of inputs none of whose outputs did. That holds for
inputs reaching every output too: autograd runs a node even when all its
outputs' gradients are ``None`` (a later graph's node reached it and passed
``None`` on), and AOTAutograd would send zeros on where eager never runs.

An input the graph changes in place is one of the node's outputs too: AOTAutograd
returns its new value and copies it into the input, so the input's history then
runs through the node. Such an input counts as one more output of the graph here.

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

    Output positions count the graph's outputs, then the inputs it changes in place
    (``mutated``: their placeholder positions, in that order).
    ``gated``: (placeholder position or None, parameter or None, frozenset of output
    positions it reaches) for each input that needs grad;
    ``differentiable``: the output positions that require grad; ``params``: every parameter
    of the graph that requires grad (their autograd edges bound the search for the node).
    """
    __slots__ = ("gated", "differentiable", "params", "mutated")

    def __init__(self, gated, differentiable, params, mutated=()):
        self.gated = gated
        self.differentiable = differentiable
        self.params = params
        self.mutated = tuple(mutated)

    def results(self, args, outs):
        """The graph's outputs, then the inputs it changed in place, after a call."""
        if not self.mutated:
            return outs
        return list(outs) + [args[pos] for pos in self.mutated]


def plan(gm):
    """The Plan for ``gm`` (outputs already a flat tuple), or None when every gradient eager
    computes is also exactly what AOTAutograd computes (or the graph carries no fake values)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output_node = gm.graph.output_node()
    (outs,) = output_node.args
    # Each input that needs grad, keyed by its autograd edge on the fake tensors.
    by_edge = {}
    inputs = []   # (placeholder position, parameter, fake)
    input_edges = {}   # input index -> (grad_fn, output_nr) the tracer saw before any in-place op
    mutated = []  # (placeholder position, fake) of inputs needing grad changed in place
    for pos, node in enumerate(placeholders):
        fake = node.meta.get("example_value")
        if fake is None and node.users:
            return None
        if isinstance(fake, torch.Tensor) and fake.requires_grad:
            if fake.grad_fn is not None:
                edge = node.meta.get("input_grad_edge")
                if edge is None:
                    if fake._version != 0:
                        return None      # changed in place: its own edge is no longer known
                    edge = (fake.grad_fn, fake.output_nr)
                input_edges[len(inputs)] = edge
                if fake._version != 0:
                    mutated.append((pos, fake))
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
        if not isinstance(param, torch.Tensor) or not param.requires_grad or param.grad_fn is not None:
            return None
        inputs.append((None, param, fake))
    if not inputs:
        return None
    alive = []    # grad_fn wrappers whose ids are keys: kept alive so no id is reused
    for i, (_, _, fake) in enumerate(inputs):
        if i in input_edges:
            grad_fn, nr = input_edges[i]
            alive.append(grad_fn)
            key = (id(grad_fn), nr)
        else:
            key = ("leaf", id(fake))
        by_edge.setdefault(key, []).append(i)

    differentiable = []
    reached = [set() for _ in inputs]
    reach = _Reach(by_edge)
    results = [out.meta.get("example_value") if isinstance(out, torch.fx.Node) else None for out in outs]
    results += [fake for _, fake in mutated]
    for j, fake in enumerate(results):
        if not isinstance(fake, torch.Tensor) or not fake.requires_grad:
            continue
        differentiable.append(j)
        for i in reach.inputs_of(fake):
            reached[i].add(j)
    if not differentiable:
        return None
    # Every input is gated, even one reaching every output: the node also runs when none of its
    # outputs got a gradient (a later graph's node, gated itself, passed None to all of them),
    # and then AOTAutograd's zeros must not reach inputs eager's backward never visits.
    gated = [(pos, param, frozenset(r)) for (pos, param, _), r in zip(inputs, reached)]
    return Plan(gated, sorted(differentiable), [param for _, param, _ in inputs if param is not None],
                [pos for pos, _ in mutated])


def _attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _tensor_key(t, alive):
    """The key of the autograd edge a tensor's gradient arrives through (see ``_edge_key``)."""
    if t.grad_fn is None:
        return ("leaf", id(t))
    alive.append(t.grad_fn)
    return (id(t.grad_fn), t.output_nr)


def _edge_key(node, nr):
    """An edge of the autograd graph as a key: a leaf's AccumulateGrad by the leaf it feeds
    (no op is run to find it), any other node by identity and input number."""
    if type(node) is _accumulate_grad_type():
        return ("leaf", id(node.variable))
    return (id(node), nr)


_ACCUMULATE_GRAD = []


def _accumulate_grad_type():
    if not _ACCUMULATE_GRAD:
        # (Asked for while compiling a graph cut inside `with torch.no_grad()` too.)
        with torch.enable_grad():
            leaf = torch.zeros((), requires_grad=True)
            _ACCUMULATE_GRAD.append(type((leaf * 1).grad_fn.next_functions[0][0]))
    return _ACCUMULATE_GRAD[0]


class _Reach:
    """Which inputs each autograd node's history reaches, memoized over one graph."""

    def __init__(self, by_edge):
        self.by_edge = by_edge
        self.memo = {}        # id(node) -> frozenset of input indices
        self.alive = []       # the node wrappers whose ids are in ``memo``, kept alive

    def inputs_of(self, fake):
        grad_fn = fake.grad_fn
        if grad_fn is None:
            return frozenset(self.by_edge.get(("leaf", id(fake)), ()))
        self.alive.append(grad_fn)
        hit = self.by_edge.get((id(grad_fn), fake.output_nr))
        if hit is not None:
            return frozenset(hit)
        self._fill(grad_fn)
        return self.memo[id(grad_fn)]

    def _fill(self, root):
        """Post-order over the nodes under ``root`` not seen yet (no recursion: graphs are deep)."""
        by_edge, memo = self.by_edge, self.memo
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in memo:
                continue
            edges = node.next_functions
            if not expanded:
                stack.append((node, True))
                # Children stay alive on the stack, then in ``alive``: the same wrappers (and ids)
                # come back when this node is expanded.
                stack.extend((n, False) for n, nr in edges
                             if n is not None and _edge_key(n, nr) not in by_edge and id(n) not in memo)
                continue
            found = set()
            for n, nr in edges:
                if n is None:
                    continue
                hit = by_edge.get(_edge_key(n, nr))
                if hit is not None:
                    found.update(hit)
                elif id(n) in memo:
                    found.update(memo[id(n)])
            memo[id(node)] = frozenset(found)
            self.alive.append(node)


def gate(compiled, plan):
    """Wrap ``compiled`` (positional inputs -> flat outputs) so that the gradients ``plan`` names
    are dropped in the backwards where eager would not compute them."""
    if plan is None:
        return compiled
    state = _Matching(plan)

    def run(*args):
        hook = state.hook
        if hook is not None and state.output is not None:
            outs = compiled(*args)
            grad_fn = outs[state.output].grad_fn
            if type(grad_fn) is state.node_type:
                grad_fn.register_hook(hook)
            return outs
        if not torch.is_grad_enabled() or hook is None and not state.pending:
            return compiled(*args)
        # Taken before the call: the graph may change an input in place, moving its grad_fn.
        alive = []
        keys = [_tensor_key(t, alive) if isinstance(t, torch.Tensor) and t.requires_grad else None
                for t in args]
        outs = compiled(*args)
        if hook is None:
            state.match(keys, plan.results(args, outs))
        else:
            # Only changed inputs lead to the node (through the copy into them): found again.
            node = state.find_node(keys, plan.results(args, outs))
            if node is not None:
                node.register_hook(hook)
        return outs

    return run


class _Matching:
    """Matches AOTAutograd's node to the graph's inputs and outputs on the first call with grads."""

    def __init__(self, plan):
        self.plan = plan
        self.pending = True
        self.hook = None
        self.output = None        # an output whose grad_fn is the node itself
        self.via = None           # else an output (a changed input) the node is found from
        self.node_type = None

    def _stop(self, arg_keys):
        # The search for AOTAutograd's node stops at the autograd edges of the graph's inputs,
        # so that a node of an earlier graph behind an input is never taken for this one.
        return {k for k in arg_keys if k is not None} | {("leaf", id(p)) for p in self.plan.params}

    def find_node(self, arg_keys, results):
        """This call's node, walking from the output ``via`` (after a first call matched)."""
        out = results[self.via]
        if not isinstance(out, torch.Tensor) or out.grad_fn is None:
            return None
        for n, _ in _node_slots(out, self._stop(arg_keys)):
            if type(n) is self.node_type:
                return n
        return None

    def match(self, arg_keys, outs):
        """``arg_keys``: the autograd edge key of each argument needing grad (else None), taken
        before the call."""
        plan = self.plan
        param_keys = {id(p): ("leaf", id(p)) for p in plan.params}
        stop = self._stop(arg_keys)
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
                            if j < len(outs) - len(plan.mutated) and isinstance(outs[j], torch.Tensor)
                            and outs[j].grad_fn is node), None)
        if self.output is None:
            self.via = next(iter(slots), None)
            if self.via is None:
                return
        next_functions = node.next_functions
        gated = []
        for pos, param, reached in plan.gated:
            key = arg_keys[pos] if pos is not None else param_keys.get(id(param))
            if key is None:
                continue
            from_slots = frozenset(s for j in reached for s in slots.get(j, ()))
            for k, (n, nr) in enumerate(next_functions):
                if n is not None and _edge_key(n, nr) == key:
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
            if n is None or _edge_key(n, nr) in stop:
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
