"""Benchmarks comparing bytegraph with torch.compile; see bench/README.md."""
