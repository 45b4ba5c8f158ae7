"""Low-precision (bf16) parameters trained without losing small updates:
an fp32 master copy (``master_weights=True``) or stochastic rounding
(``stochastic_rounding=True``), for every sync-free optimizer and both of
its paths.

Algorithm, per step, for the parameters p that are not float32 in a group
that asks for either (float32 parameters: nothing changes)::

    widen:   w = state["master"]  (master; made from p on its first step)
               | float32(p)       (stochastic rounding)
             p.data = w; g = float32(grad); state tensors -> float32
    update:  the optimizer's own update of (p, g), fused op or portable
             path, exactly as for a float32 parameter (skip included)
    narrow:  master: state["master"] = p.data
                     p = skipped ? p_old : round_to_nearest(master)
             SR:     p = round_stochastic(p.data, bits(counter, element))
                     counter += 1 unless skipped
             state tensors -> state_dtype (None: they stay float32)

Stochastic rounding of a float32 x to bfloat16 rounds |x| up to the next
bf16 value with probability equal to the dropped fraction (16 random bits
against the 16 bits bf16 drops), else down: the expected value is x. The bits are a hash of
a per-parameter 64-bit counter (high half: a key from ``torch.initial_seed()``
and the parameter's position; low half: its committed steps) and the
element index, computed on the device: no host RNG, no transfer, and a
checkpoint (the counter is in the state dict) resumes the same stream. A
skipped step leaves every bit as it was: the update is masked, an exact
bf16 value rounds to itself, the counter does not move.
"""
from __future__ import annotations

from typing import Any

import torch

from xla_amp._upload import upload

OPTIONS_DOC = """
    master_weights: for parameters that are not float32 (bf16 weights, see
        ``xla_amp.cast_module``), keep a float32 master copy in the state
        (``state["master"]``, made from the parameter on its first step);
        the update is computed on it in float32 and the parameter is the
        master rounded to nearest. Costs 4 bytes per element.
    stochastic_rounding: instead of a master, add the float32 update to the
        bf16 parameter with stochastic rounding (seeded from
        ``torch.initial_seed()`` as it is when the optimizer is built,
        reproducible from a checkpoint). bf16
        parameters only. Not together with ``master_weights``.
    state_dtype: dtype of the optimizer state of such parameters (``None``:
        float32, the update's precision; ``torch.bfloat16`` halves it);
        only with ``master_weights`` or ``stochastic_rounding`` (refused
        without either).
    Both flags are no-ops for float32 parameters. Either keeps every
    sync-free guarantee: one graph per step, no transfer, a skipped step
    leaves parameters, masters and state bit-identical."""

# The param-group keys of the low-precision options and their values in a
# group built without them (a torch.optim optimizer's): what a checkpoint's
# training record reads off each group (xla_amp/checkpoint/_record.py).
DEFAULTS = {"master_weights": False, "stochastic_rounding": False, "state_dtype": None}
KEYS = tuple(DEFAULTS)
_MASTER = "master"
_COUNTER = "sr_counter"
_M32 = 0xFFFFFFFF


def options(name: str, master_weights, stochastic_rounding, state_dtype) -> dict[str, Any]:
    """The group keys of the low-precision options, checked."""
    for key, v in (("master_weights", master_weights),
                   ("stochastic_rounding", stochastic_rounding)):
        if not isinstance(v, bool):
            raise ValueError(f"{name}: {key} must be a bool, got {v!r}")
    if master_weights and stochastic_rounding:
        raise ValueError(f"{name}: master_weights=True and stochastic_rounding=True "
                         "exclude each other (a master copy makes rounding exact); pick one")
    if state_dtype is not None and not (isinstance(state_dtype, torch.dtype)
                                        and state_dtype.is_floating_point):
        raise ValueError(f"{name}: state_dtype must be a floating torch.dtype or None, "
                         f"got {state_dtype!r}")
    if state_dtype is not None and not (master_weights or stochastic_rounding):
        raise ValueError(f"{name}: state_dtype={state_dtype} applies to the state of "
                         "parameters trained with master_weights or stochastic_rounding; "
                         "without either, state keeps the parameter's dtype (as in "
                         "torch.optim): pass one of them, or leave state_dtype=None")
    return dict(master_weights=master_weights, stochastic_rounding=stochastic_rounding,
                state_dtype=state_dtype)


def applies(group: dict[str, Any], params: list[torch.Tensor]) -> bool:
    return bool(group.get("master_weights") or group.get("stochastic_rounding")) and any(
        p.dtype != torch.float32 for p in params)


def check(opt, gi: int, group: dict[str, Any]) -> None:
    """Raises before any update when stochastic rounding meets a parameter
    it cannot round (only bfloat16)."""
    if not group.get("stochastic_rounding"):
        return
    for pi, p in enumerate(group["params"]):
        if p.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(
                f"{type(opt).__name__}: parameter {pi} of param group {gi} is {p.dtype}; "
                "stochastic_rounding rounds to bfloat16 only (use master_weights)")


def step(opt, gi: int, group: dict[str, Any], skip, params: list[torch.Tensor],
         grads: list[torch.Tensor]) -> bool:
    """One update of `params` through the widen / update / narrow scheme
    above; returns whether the fused op ran."""
    low = [i for i, p in enumerate(params) if p.dtype != torch.float32]
    olds = {i: params[i].data for i in low}
    master = group.get("master_weights")
    grads = list(grads)
    positions = None  # parameter -> position in the optimizer, built when first needed
    for i in low:
        p = params[i]
        st = opt.state[p]
        if not master and _COUNTER not in st and positions is None:
            positions = positions_of(opt)
        init_state(group, p, st, positions[id(p)] if positions else 0, opt._seed)
        p.data = st[_MASTER] if master else p.detach().float()
        grads[i] = grads[i].float()
        _retype_state(opt, st, torch.float32)
    try:
        fused = opt._fused_or_raise(gi, group, None)
        opt._update_group(gi, group, skip, params, grads, fused)
    except BaseException:  # put the parameters back as they were
        for i in low:
            params[i].data = olds[i]
        raise
    keep = skip.keep
    for i in low:
        p = params[i]
        st = opt.state[p]
        old = olds[i]
        if master:
            st[_MASTER] = p.data
            new = st[_MASTER].to(old.dtype)
            p.data = new if keep is None else torch.where(keep, old, new)
        else:
            counter = st[_COUNTER]
            p.data = _round_stochastic(p.data, counter)
            st[_COUNTER] = counter + 1 if keep is None else torch.where(keep, counter,
                                                                        counter + 1)
        _retype_state(opt, st, group.get("state_dtype") or torch.float32)
    return fused


def init_state(group: dict[str, Any], p: torch.Tensor, st: dict[str, Any],
               position: int, seed: int | None = None) -> None:
    """What a low-precision parameter keeps besides the optimizer's own
    state, made on its first step: the master (from the parameter) or the
    rounding counter (from its position in the optimizer and ``seed``,
    the optimizer's: see :func:`_key`)."""
    if group.get("master_weights"):
        if _MASTER not in st:
            st[_MASTER] = p.detach().float()
    elif _COUNTER not in st:
        st[_COUNTER] = torch.full((), _key(position, seed), dtype=torch.int64,
                                  device=p.device)


def reserve_state(opt, group: dict[str, Any], p: torch.Tensor, st: dict[str, Any],
                  position: int) -> list[torch.Tensor]:
    """What :func:`create_state` and :func:`between_steps` leave for a
    low-precision ``p``, made before its first step (``_fresh.reserve``):
    the counter and the optimizer's state uploaded, the latter in the dtype
    the step keeps it in; the master computed from ``p``, still pending:
    returned for the caller to materialise."""
    if group.get("master_weights"):
        st[_MASTER] = p.detach().float()
    else:
        st[_COUNTER] = upload(torch.full((), _key(position, opt._seed), dtype=torch.int64),
                              p.device)
    dtype = group.get("state_dtype") or torch.float32
    opt._init_state(group, torch.empty(p.shape, dtype=dtype, device=p.device), st)
    return [st[_MASTER]] if _MASTER in st else []


def create_state(opt, group: dict[str, Any], p: torch.Tensor, st: dict[str, Any]) -> None:
    """Add to ``st`` what the next step would create for ``p``: exactly
    what :func:`step` (or, for float32 parameters and plain groups, the
    optimizer's own update) makes when it is missing. ``p`` may be a meta
    tensor: the entries then carry shapes and dtypes only."""
    if not applies(group, [p]):
        opt._init_state(group, p, st)
        return
    init_state(group, p, st, 0)
    opt._init_state(group, torch.empty_like(p, dtype=torch.float32), st)  # widened


def between_steps(opt, group: dict[str, Any], p: torch.Tensor, st: dict[str, Any]) -> None:
    """``st``'s floating state in the dtype :func:`step` leaves it in."""
    if applies(group, [p]):
        _retype_state(opt, st, group.get("state_dtype") or torch.float32)


def _retype_state(opt, st: dict[str, Any], dtype: torch.dtype) -> None:
    for key in opt._STATE_LIKE_PARAM:
        v = st.get(key)
        if isinstance(v, torch.Tensor) and v.dtype != dtype and v.is_floating_point():
            st[key] = v.to(dtype)


def positions_of(opt) -> dict[int, int]:
    """id(parameter) -> its position in ``opt`` over all param groups (the
    rounding counter's key; groups only ever append, so it is fixed)."""
    return {id(q): k for k, q in enumerate(q for g in opt.param_groups for q in g["params"])}


def _key(position: int, seed: int | None = None) -> int:
    """High half of a parameter's counter: ``seed`` (the optimizer's: the
    process seed, ``torch.initial_seed()``, when it was built; the current
    one if None) mixed with the parameter's position in the optimizer
    (positions are what a checkpoint keeps)."""
    seed = torch.initial_seed() if seed is None else seed
    mixed = (seed * 0x9E3779B1 + position * 0x85EBCA77) & 0x7FFFFFFF
    return mixed << 32


def _i32(c: int) -> int:
    """A 32-bit constant as the int32 value with the same bits."""
    return c - (1 << 32) if c >= 1 << 31 else c


_axes: dict = {}  # (length, device) -> arange(length), int32, on the device


def _element_index(shape: tuple, device) -> torch.Tensor:
    """Each element's row-major index (int32), as a sum of one small arange
    per dimension, broadcast: on PyTorch/XLA a torch.arange of a whole
    parameter costs ~90 ns of host time per element, every step (ResNet-18:
    1 s of its SR step); the per-dimension ones are made once and kept."""
    index, stride = torch.zeros((), dtype=torch.int32, device=device), 1
    for k in reversed(range(len(shape))):
        axis = _axes.get((shape[k], str(device)))
        if axis is None:  # uploaded: kept, so an output of one graph otherwise
            axis = _axes[(shape[k], str(device))] = upload(
                torch.arange(shape[k], dtype=torch.int32), device)
        index = index + axis.view([-1 if j == k else 1 for j in range(len(shape))]) * stride
        stride *= shape[k]
    return index


def _random16(counter: torch.Tensor, shape, device) -> torch.Tensor:
    """16 random bits per element (int32), a hash of counter and index.
    Wrapping int32 arithmetic (a murmur3-style finaliser; `>>` is
    arithmetic, so each shift is masked to a logical one): XLA:CPU's int64
    multiplies cost twice as much."""
    seed = ((counter & _M32) * 0x85EBCA77 + (counter >> 32) * 0xC2B2AE3D) & _M32
    x = _element_index(tuple(shape), device)
    x = x * _i32(0x9E3779B1) + (seed - ((seed >> 31) << 32)).to(torch.int32)
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * _i32(0x85EBCA6B)
    x = x ^ ((x >> 13) & 0x7FFFF)
    x = x * _i32(0xC2B2AE35)
    x = x ^ ((x >> 16) & 0xFFFF)
    return x & 0xFFFF


def _round_stochastic(x: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16, rounding |x| up with probability equal to the
    dropped fraction. Plain arithmetic (a bit-level version needs
    Tensor.view(dtype), which PyTorch/XLA runs on the host), all of it
    exact::

        v  = bf16(|x|)                    round to nearest
        c  = bf16(v * (1 + 2**-8))        v + spacing(v); v itself when v is a
                                          power of two (the tie stays even)
        s  = c - v, or v * 2**-7 when c == v      bf16's spacing above v
        |x| < v: the interval is [v - s', v], s' = s (s / 2 below a power of two)
        |x| >= v: [v, v + s]
        fraction = (|x| - low) / spacing  (16 bits), against 16 random bits

    Zero, tiny values (spacing subnormal), inf/NaN and values that round
    past bf16's largest: round to nearest."""
    a = x.abs()
    v = a.to(torch.bfloat16).float()
    c = (v * (1 + 2.0 ** -8)).to(torch.bfloat16).float()
    pow2 = c == v
    s = torch.where(pow2, v * 2.0 ** -7, c - v)
    below = a < v
    spacing = torch.where(below & pow2, s * 0.5, s)
    low = torch.where(below, v - spacing, v)
    u = _random16(counter, x.shape, x.device).to(torch.float32) * 2.0 ** -16
    mag = low + spacing * (u < (a - low) / spacing).to(torch.float32)
    rounded = torch.where(x < 0, -mag, mag)
    ordinary = (a >= 2.0 ** -118) & torch.isfinite(c)
    return torch.where(ordinary, rounded, x).to(torch.bfloat16)
