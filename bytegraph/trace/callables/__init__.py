"""What a call does, decided by what is called: Python functions inlined, builtins and the
standard library answered by handlers, methods of lists, dicts and sets, the environment."""
