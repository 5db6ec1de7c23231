"""Node targets that fx's code printer would print as code meaning something else.

fx prints ``operator.pow(c, x)`` as ``c ** x`` with ``c`` written by ``repr``: for a negative
constant that is ``-2.0 ** x``, which Python reads as ``-(2.0 ** x)`` (``**`` binds tighter than
the unary minus). Such a node calls ``power`` instead, printed as a call. AOTAutograd traces
``power`` into a graph of its own, printed the same way: on a symbolic int exponent it computes
with the base's magnitude and the sign (``(-2) ** n`` as ``(1 - 2 * (n % 2)) * 2 ** n``).
"""
import math
import operator

import torch


def power(base, exponent):
    """``base ** exponent`` for a negative constant ``base`` (a node target fx prints as a call)."""
    if isinstance(exponent, torch.SymInt):
        return (1 - 2 * (exponent % 2)) * ((-base) ** exponent)
    return base ** exponent


def printable(target, args):
    """The target to give a node of ``target(*args)`` so that its printed code means that."""
    if target is operator.pow and args and type(args[0]) in (int, float) and math.copysign(1, args[0]) < 0:
        return power
    return target
