"""The NULL that CALL's calling convention puts next to a callable.

The interpreter keeps it on its stack among the values (``values``), and
``bytecode.versions`` tells by it which stack slot holds the callable, so it
lives below both, on the lowest floor.
"""


class NullValue:
    """The NULL that CALL's calling convention puts next to a callable."""
    __slots__ = ()
    source = None   # like every value on the stack: where it could be re-read from (nowhere)

    def __repr__(self):
        return "NullValue(NULL)"


NULL = NullValue()
