"""What ``bytegraph.explain(fn)(*args)`` reports: graphs, breaks, ops and guards (``api.explain`` runs it)."""
from __future__ import annotations
from dataclasses import dataclass, field

import torch

from ..stacks import format_stack


@dataclass
class BreakReason:
    reason: str
    user_stack: list          # traceback.FrameSummary, outermost first, the breaking line last
    graph_break: bool = True  # False: the whole frame ran eagerly instead of resuming
    hint: str | None = None   # what the user can do to avoid the break


@dataclass
class ExplainOutput:
    graphs: list[torch.fx.GraphModule] = field(default_factory=list)
    graph_count: int = 0
    graph_break_count: int = 0
    break_reasons: list[BreakReason] = field(default_factory=list)
    op_count: int = 0
    ops_per_graph: list[list] = field(default_factory=list)
    out_guards: list = field(default_factory=list)          # guards.builder.Guard
    ddp_splits: list = field(default_factory=list)   # backends.ddp.DDPSplit: graphs cut for DDP's buckets

    def __str__(self) -> str:
        lines = [f"Graph Count: {self.graph_count}",
                 f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}",
                 "Break Reasons:"]
        for i, br in enumerate(self.break_reasons, 1):
            lines.append(f"  Break Reason {i}:")
            lines.append(f"    Reason: {br.reason}")
            if not br.graph_break:
                lines.append("    (the rest of this frame ran eagerly)")
            lines.append("    User Stack:")
            lines.extend(format_stack(br.user_stack, indent="      "))
            if br.hint:
                lines.append(f"    Hint: {br.hint}")
        if self.ddp_splits:
            lines.append("DDP Splits:")
            lines.extend(split.describe(indent="  ") for split in self.ddp_splits)
        lines.append("Ops per Graph:")
        for i, ops in enumerate(self.ops_per_graph, 1):
            lines.append(f"  Ops {i}:")
            lines.extend(f"    {op}" for op in ops)
        lines.append("Out Guards:")
        for i, g in enumerate(self.out_guards, 1):
            lines.append(f"  Guard {i}: {g.describe()}")
        return "\n".join(lines) + "\n"


def _ops(gm):
    # Like torch._dynamo.explain: function calls only (tensor methods are not counted).
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]
