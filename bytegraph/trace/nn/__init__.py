"""nn.Module in the trace: module calls with their hooks, repeated blocks traced once, and the
enumeration of parameters, buffers and submodules."""
