"""``torch._dynamo.config`` while ``patch_torch_compile`` is active: what code sets there means the
same for bytegraph.

Before each compile (``dispatch.before_miss``) the settings below are read from
``torch._dynamo.config`` when it is loaded (code that sets them has imported it; nothing here
imports it), and a setting whose value changed since it was last read (since torch's default,
the first time) is carried into ``bytegraph.config``, or warned about once when bytegraph has no
equivalent. A setting made on ``bytegraph.config`` stays until code changes torch's again.
``deactivate`` gives each ``bytegraph.config`` setting still holding what was carried into it the
value it had before.

Also while patched: the compiler's stance (``stance.py``) is kept in torch's own
``torch._dynamo.eval_frame`` too, so functions compiled by torch itself before the patch, and
torch code reading the stance (compiled autograd), see the same one.
"""
import sys
import warnings

from ..config import config, warn_once
from . import dispatch, stance

_active = [False]
_seen = {}       # torch setting -> the value last read
_carried = {}    # bytegraph setting -> [its value before a torch setting was first carried in, the value carried]


def _carry(name, value):
    if getattr(config, name) != value:
        _carried.setdefault(name, [getattr(config, name), None])[1] = value
        setattr(config, name, value)


def _limit(name):
    return lambda v: _carry(name, max(int(v), 1))


def _flag(name):
    return lambda v: _carry(name, bool(v))


def _optimize_ddp(value):
    if value in (True, False, "ddp_optimizer", "no_optimization"):
        _carry("optimize_ddp", value in (True, "ddp_optimizer"))
    else:
        warn_once("optimize_ddp", f"bytegraph: torch._dynamo.config.optimize_ddp = {value!r} has no bytegraph "
                                  "equivalent (bytegraph splits graphs at DDP's buckets or not: True or False); "
                                  "bytegraph.config.optimize_ddp is left as it is")


def _not_yet(setting, what):
    def note(value):
        if value:
            warn_once(setting, f"bytegraph: torch._dynamo.config.{setting} = True: {what}")
    return note


# torch._dynamo.config setting -> (torch's default, what a changed value does)
SETTINGS = {
    "recompile_limit": (8, _limit("cache_size_limit")),     # alias: cache_size_limit
    "accumulated_recompile_limit": (256, _limit("accumulated_cache_size_limit")),
    "suppress_errors": (False, _flag("suppress_errors")),
    "automatic_dynamic_shapes": (True, _flag("automatic_dynamic_shapes")),
    "assume_static_by_default": (True, _flag("assume_static_by_default")),
    "error_on_recompile": (False, _flag("error_on_recompile")),
    "optimize_ddp": (True, _optimize_ddp),
    "capture_scalar_outputs": (False, _flag("capture_scalar_outputs")),
    "capture_dynamic_output_shape_ops": (False, _flag("capture_dynamic_output_shape_ops")),
    "skip_fwd_side_effects_in_bwd_under_checkpoint": (False, _not_yet(
        "skip_fwd_side_effects_in_bwd_under_checkpoint", "bytegraph has no equivalent: Python side effects of a "
        "checkpointed function happen again when backward recomputes it, as in eager")),
    "force_parameter_static_shapes": (True, lambda v: v or warn_once(
        "force_parameter_static_shapes", "bytegraph: torch._dynamo.config.force_parameter_static_shapes = False has "
        "no bytegraph equivalent: parameters and buffers always keep static sizes")),
}


def sync():
    """Carry what changed in ``torch._dynamo.config`` into ``bytegraph.config``."""
    torch_config = sys.modules.get("torch._dynamo.config")
    if torch_config is None:
        return
    values = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")    # torch's deprecation notes on reading a setting
        for name in SETTINGS:
            try:
                values[name] = getattr(torch_config, name)
            except AttributeError:      # another torch version
                pass
    for name, value in values.items():
        default, apply = SETTINGS[name]
        if value != _seen.get(name, default):
            _seen[name] = value
            apply(value)


def _mirror_stance(old, new):
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return
    try:
        eval_frame._set_stance(eval_frame.DynamoStance(new.name, new.skip_guard_eval_unsafe, new.force_backend))
    except Exception:   # noqa: BLE001 - torch refuses inside its own compiled region; ours is set
        pass


def activate():
    if _active[0]:
        return
    _active[0] = True
    dispatch.before_miss.append(sync)
    stance.on_change(_mirror_stance)
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    torch_stance = getattr(eval_frame, "_stance", None)
    if torch_stance is not None and stance.current[0] == stance.DEFAULT and torch_stance.stance in stance.STANCES:
        # A stance set through torch before the patch holds for bytegraph too.
        stance.apply(stance.Stance(torch_stance.stance, torch_stance.skip_guard_eval_unsafe, torch_stance.backend))
    sync()


def deactivate():
    if not _active[0]:
        return
    _active[0] = False
    if sync in dispatch.before_miss:
        dispatch.before_miss.remove(sync)
    stance.remove_listener(_mirror_stance)
    for name, (before, carried) in _carried.items():
        if getattr(config, name) == carried:      # not set on bytegraph.config since
            setattr(config, name, before)
    _carried.clear()
    _seen.clear()
