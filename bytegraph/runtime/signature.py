"""A function's signature spelled as Python text, for the wrappers that dispatch and
compile_frame generate with the same parameters as the function."""


def _signature_parts(fn):
    """(parameter list text, call-argument text, call-original text, defaults namespace)."""
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
    if code.co_flags & 0x04:
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
    if code.co_flags & 0x08:
        dstar = names[pos]
        params.append(f"**{dstar}")
        passthrough.append(dstar)
        original.append(f"**{dstar}")
    if code.co_freevars:
        passthrough.append("__closure")
    return params, passthrough, original, ns
