"""torch's surface in the trace: torch functions and global-state managers, torch's own wrappers,
higher-order operators and autograd.Function, torch.distributed, pytree."""
