"""A function's signature spelled as Python text, for the wrappers that dispatch and
compile_frame generate with the same parameters as the function."""
import inspect


class _Unset:
    """The value a wrapper's parameter has when the caller left it to its default."""

    def __repr__(self):
        return "<default>"


UNSET = _Unset()


def default_now(fn, index, name):
    """Positional parameter ``name``'s default as ``fn`` has it now: item ``index`` (counted from
    the end, as Python lines defaults up with the last parameters) of ``fn.__defaults__``."""
    defaults = fn.__defaults__ or ()
    if -index > len(defaults):
        raise TypeError(f"{fn.__qualname__}() missing 1 required positional argument: {name!r}")
    return defaults[index]


def kwdefault_now(fn, name):
    kwdefaults = fn.__kwdefaults__ or {}
    if name not in kwdefaults:
        raise TypeError(f"{fn.__qualname__}() missing 1 required keyword-only argument: {name!r}")
    return kwdefaults[name]


def default_reads(fn):
    """Lines a wrapper with ``fn``'s parameters (defaults spelled ``UNSET``: ``_signature_parts``)
    starts with: each parameter the caller left to its default gets the default ``fn`` has
    *now*, as calling ``fn`` would (``fn.__defaults__`` may be set after the wrapper is made)."""
    code = fn.__code__
    names, nargs = code.co_varnames, code.co_argcount
    lines = [f"if {names[i]} is __UNSET: {names[i]} = __default_now(__fn, {i - nargs}, {names[i]!r})"
             for i in range(nargs - len(fn.__defaults__ or ()), nargs)]
    lines += [f"if {name} is __UNSET: {name} = __kwdefault_now(__fn, {name!r})"
              for name in names[nargs:nargs + code.co_kwonlyargcount] if name in (fn.__kwdefaults__ or {})]
    return lines


def _signature_parts(fn):
    """(parameter list text, call-argument text, call-original text, defaults namespace).
    A parameter with a default is spelled ``name=__dN`` (``__kw_name``), named in the namespace."""
    code = fn.__code__
    names = code.co_varnames
    nargs, nposonly, nkwonly = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    defaults = fn.__defaults__ or ()
    kwdefaults = fn.__kwdefaults__ or {}
    ns = {}
    params, passthrough, original = [], [], []
    first_default = nargs - len(defaults)
    for i in range(nargs):
        name = names[i]
        if i >= first_default:
            dname = f"__d{i}"
            ns[dname] = defaults[i - first_default]
            params.append(f"{name}={dname}")
        else:
            params.append(name)
        if i == nposonly - 1:
            params.append("/")
        passthrough.append(name)
        original.append(name)
    pos = nargs + nkwonly
    star = None
    if code.co_flags & inspect.CO_VARARGS:
        star = names[pos]
        params.append(f"*{star}")
        original.append(f"*{star}")
        pos += 1
    elif nkwonly:
        params.append("*")
    for name in names[nargs:nargs + nkwonly]:
        if name in kwdefaults:
            dname = f"__kw_{name}"
            ns[dname] = kwdefaults[name]
            params.append(f"{name}={dname}")
        else:
            params.append(name)
        passthrough.append(name)
        original.append(f"{name}={name}")
    # The frame's values go in co_varnames order (positional, keyword-only, *args, **kwargs),
    # the order of frame_params, which names the guard and transformed functions' parameters.
    if star is not None:
        passthrough.append(star)
    if code.co_flags & inspect.CO_VARKEYWORDS:
        dstar = names[pos]
        params.append(f"**{dstar}")
        passthrough.append(dstar)
        original.append(f"**{dstar}")
    if code.co_freevars:
        passthrough.append("__closure")
    return params, passthrough, original, ns
