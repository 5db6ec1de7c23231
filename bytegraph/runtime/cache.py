"""Cache entries: (guard, run) pairs per code object, newest first."""
from dataclasses import dataclass, field


@dataclass
class CacheEntry:
    guard: object             # guard(*frame_args) -> bool
    run: object               # run(*frame_args) -> result (transformed function, or the original)
    explain: object           # explain(*frame_args) -> str | None (first failing guard)
    guards: list              # the Guard records, for listings
    graph: object = None      # the fx.GraphModule handed to the backend (None: no graph)
    transformed_source: str = ""
    guard_source: str = ""
    fallback_reason: str = None   # set when this entry runs the frame eagerly

    def as_tuple(self):
        return (self.guard, self.run)


@dataclass
class CodeCache:
    """Everything cached for one code object under one compile() call."""
    code: object
    entries: list = field(default_factory=list)        # CacheEntry, newest first
    dispatch: list = field(default_factory=list)       # (guard, run) tuples mirroring entries
    eager_forever: bool = False
    recompile_reasons: list = field(default_factory=list)
    warned: bool = False
    auto_dynamic: dict = field(default_factory=dict)          # source -> dims whose size changed
    auto_dynamic_scalars: set = field(default_factory=set)    # int sources whose value changed

    def add(self, entry):
        self.entries.insert(0, entry)
        self.dispatch.insert(0, entry.as_tuple())

    def clear(self):
        self.entries.clear()
        self.dispatch.clear()
        self.eager_forever = False
        self.recompile_reasons.clear()
        self.warned = False
        self.auto_dynamic.clear()
        self.auto_dynamic_scalars.clear()
