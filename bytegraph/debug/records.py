"""What compilation did, kept for diagnostics (explain, profiler, tests)."""
from dataclasses import dataclass, field


@dataclass
class FrameRecord:
    name: str                 # qualified name of the compiled function
    filename: str
    firstlineno: int
    graph: object = None      # fx.GraphModule, None when no graph was made
    guards: list = field(default_factory=list)
    fallback_reason: str = None   # the whole frame runs eagerly, for this reason
    break_reason: str = None      # the frame stops at a graph break, for this reason
    user_stack: list = field(default_factory=list)   # traceback.FrameSummary, outermost first
    hint: str = None              # what the user can do about the break / fallback
    transformed_source: str = ""
    guard_source: str = ""
    ddp_splits: list = field(default_factory=list)   # backends.ddp.DDPSplit: graphs cut at DDP bucket boundaries


@dataclass
class RecompileRecord:
    name: str
    filename: str
    firstlineno: int
    reason: str               # the first failing guard, in the user's terms
    gave_up: bool = False     # True when the cache limit made the frame run eagerly instead


frames = []
recompiles = []


def record(rec):
    frames.append(rec)


def clear():
    frames.clear()
    recompiles.clear()
