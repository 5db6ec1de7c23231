"""State shared by every frame of one trace: the graph, the guards, the memo."""
from ..graph.builder import GraphBuilder
from ..guards.builder import GuardSet, add_global_state_guards

# Instructions one trace may execute before giving up (unrolled loops count).
INSTRUCTION_BUDGET = 200_000
MAX_INLINE_DEPTH = 48


class TraceContext:
    def __init__(self, options, fn_globals):
        self.options = options
        self.graph = GraphBuilder()
        self.guards = GuardSet()
        add_global_state_guards(self.guards)
        self.memo = {}                 # id(real object) -> (object, value)
        self.root_globals = fn_globals
        self.instructions_left = INSTRUCTION_BUDGET
        self.frames = []               # active frames, innermost last
        self.state_changes = []        # global state entered by with-blocks, undone at the end
        import torch
        self.entry_grad_mode = torch.is_grad_enabled()

    def is_trusted_source(self, source):
        return False

    def user_stack(self):
        """FrameSummary list for the active frames, innermost last."""
        import traceback
        out = []
        for f in self.frames:
            ins = f.current
            line = ins.line if ins is not None else f.code.co_firstlineno
            out.append(traceback.FrameSummary(f.code.co_filename, line, f.code.co_name))
        return out
