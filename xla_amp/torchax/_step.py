"""`make_train_step`: a model, a loss, an optimizer, a policy and a loss
scaler as one jitted torchax training step.

    step = make_train_step(model, loss_fn, optax.adamw(1e-3), policy="tpu")
    for x, y in batches:
        loss = step(x, y)              # a JAX array; nothing read back

Algorithm (one jax.jit, one XLA program per step)::

    state = (params, buffers, opt_state, scaler_state, rng)   # JAX arrays
    step(state, batch):
        (scaled, (loss, buffers', rng')), grads = value_and_grad over params of:
            with env, prng=rng, autocast(policy, dtype):  # _region.py
                out  = functional_call(model, params + buffers, inputs)
                loss = loss_fn(out, target)
                rng' = the env's key after them          # split at each draw
            scaled = scaler.scale(loss)                  # (dropout etc.), else rng
        (no scaler: the update as it comes, no check and no skip; else)
        fp8 delayed layers: amax(g) is the gradient of a zero probe each;
        their histories roll after the update (kept on a skip)
        grads, found_inf = scaler.unscale(grads)         # one reduction;
                                                         # global on a mesh
        params', opt_state' = optimizer update           # _optim.py
        params, buffers, opt_state, rng =                # a skip keeps every
            where(found_inf, old, new)                   #   leaf bit for bit
        scaler_state = scaler.update(found_inf)
        return state', (loss, found_inf, scale)

With a `mesh`, parameters (and the optimizer state made from them) are
replicated or FSDP-sharded (dim 0 over every mesh axis where it divides)
and the batch is split along its first dimension: JAX's SPMD partitioner
places the collectives, found_inf included. Works the same across
processes after ``jax.distributed.initialize``.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import torch

from xla_amp.torchax import _fp8, _optim
from xla_amp.torchax._region import autocast as _autocast
from xla_amp.torchax._scaler import LossScaler

SHARDING = ("replicate", "fsdp")


def _param_sharding(mesh, arr, how):
    from jax.sharding import NamedSharding, PartitionSpec as P
    axes = tuple(mesh.axis_names)
    if how == "fsdp" and arr.ndim and arr.shape[0] % mesh.devices.size == 0:
        return NamedSharding(mesh, P(axes))
    return NamedSharding(mesh, P())


class TrainStep:
    """The jitted step and the state it carries; see the module docstring."""

    def __init__(self, model, loss_fn, optimizer, *, policy=None, dtype=None, enabled=True,
                 scaler: LossScaler | None = None, mesh=None, sharding="replicate", env=None,
                 backend=None, seed: int | None = None, fp32_matmul_precision=None,
                 fused_attention: bool | None = None):
        import torchax
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"make_train_step: model must be an nn.Module, got "
                            f"{type(model).__name__}")
        if not callable(loss_fn):
            raise TypeError("make_train_step: loss_fn must be callable(output, target)")
        if sharding not in SHARDING:
            raise ValueError(f"make_train_step: sharding must be one of {SHARDING}, got "
                             f"{sharding!r}")
        if scaler is not None and not isinstance(scaler, LossScaler):
            raise TypeError(f"make_train_step: scaler must be a LossScaler, got "
                            f"{type(scaler).__name__}")
        self.env = env or torchax.default_env()
        self.region = _autocast("jax", enabled=enabled, dtype=dtype, policy=policy,
                                env=self.env, backend=backend,
                                fp32_matmul_precision=fp32_matmul_precision,
                                fused_attention=fused_attention)
        self.scaler = scaler or LossScaler(enabled=False)
        self.model, self.loss_fn, self.mesh, self.sharding = model, loss_fn, mesh, sharding
        from xla_amp.fp8._history import delayed_layers
        # delayed-scaling fp8 layers: their amax(g) comes back as a probe's gradient
        self._fp8 = delayed_layers(model)
        names_by_id = {id(p): n for n, p in model.named_parameters()}
        self.optimizer = _optim.adapter(optimizer, names_by_id)
        params = {n: p.detach() for n, p in model.named_parameters()}
        buffers = {n: b.detach() for n, b in model.named_buffers()}
        params, buffers = self.env.t2j_copy(params), self.env.t2j_copy(buffers)
        with self.env:
            scaler_state = {k: v.jax() for k, v in self.scaler.init().items()}
        opt_state = self.optimizer.init(params, self.env)
        if seed is None:
            seed = torch.initial_seed() % (1 << 31)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"make_train_step: seed must be an int, got {seed!r}")
        rng = jax.random.PRNGKey(seed)
        self.state = self._place((params, buffers, opt_state, scaler_state, rng))
        self._jitted = jax.jit(self._step, compiler_options=_fp8.compiler_options(
            model, jax.default_backend(), os.environ.get("XLA_FLAGS", "")))
        self.metrics = {}

    # -- placement ---------------------------------------------------------
    def _place(self, state):
        if self.mesh is None:
            return state
        from jax.sharding import NamedSharding, PartitionSpec as P
        params, buffers, opt_state, scaler_state, rng = state
        shard = lambda a: _put(a, _param_sharding(self.mesh, a, self.sharding))  # noqa: E731
        rep = lambda a: _put(a, NamedSharding(self.mesh, P()))  # noqa: E731
        return (jax.tree_util.tree_map(shard, params), jax.tree_util.tree_map(rep, buffers),
                jax.tree_util.tree_map(shard, opt_state), jax.tree_util.tree_map(rep, scaler_state),
                rep(rng))

    def place_batch(self, *batch):
        """Batch arrays as the step takes them (split along dim 0 on a mesh).
        Across processes every process passes the global batch, as one
        process does; each fills the rows its own devices hold from its own
        copy (`_put`)."""
        out = []
        for b in batch:
            if isinstance(b, torch.Tensor) and not hasattr(b, "jax"):
                b = self.env.t2j_copy(b)
            elif hasattr(b, "jax"):
                b = b.jax()
            if self.mesh is not None:
                from jax.sharding import NamedSharding, PartitionSpec as P
                b = _put(b, NamedSharding(self.mesh, P(tuple(self.mesh.axis_names))))
            out.append(b)
        return tuple(out)

    # -- the step ----------------------------------------------------------
    def _forward_loss(self, params, probes, buffers, scaler_state, rng, batch):
        env = self.env
        # the step's own key: torchax's is a process-wide value a trace would
        # bake in (every step the same dropout mask) and a resume would lose.
        # torchax splits it at each draw (get_and_rotate_prng_key) and keeps
        # the rest: that rest is the next step's key, so a model that draws
        # nothing has no key arithmetic in its program (no threefry split)
        with env, env.override_property(prng=rng), self.region, \
                _fp8.probing({m: probes[n] for n, m in self._fp8}):
            p, b, s, args = env.j2t_iso((params, buffers, scaler_state, batch))
            out = torch.func.functional_call(self.model, {**p, **b}, tuple(args[:-1]))
            loss = self.loss_fn(out, args[-1])
            rng = env.param.prng
        with env:
            scaled = self.scaler.scale(loss, s)
            new_buffers = {k: v.jax() for k, v in b.items()}
            return scaled.jax(), (loss.jax(), new_buffers, rng)

    def _step(self, state, batch):
        params, buffers, opt_state, scaler_state, rng = state
        before = (params, buffers, opt_state, rng)
        probes = {n: jnp.zeros((), jnp.float32) for n, _ in self._fp8}
        sharded = self.mesh is not None and self.sharding == "fsdp"
        with _fp8.sharded_parameters(sharded):  # the backward is traced in here too
            (_, (loss, buffers, rng)), (grads, amax_g) = jax.value_and_grad(
                self._forward_loss, argnums=(0, 1), has_aux=True)(
                params, probes, buffers, scaler_state, rng, batch)
        env = self.env
        if not self.scaler.enabled:  # no scaler: no check, no skip (nothing in the program)
            params, opt_state = self.optimizer.update(params, grads, opt_state, env)
            buffers = self._roll_fp8(buffers, amax_g, None)
            metrics = {"loss": loss, "found_inf": jnp.zeros((), bool),
                       "scale": scaler_state["scale"]}
            return (params, buffers, opt_state, scaler_state, rng), metrics
        with env:
            g, s = env.j2t_iso((grads, scaler_state))
            g, found_inf = self.scaler.unscale(g, s)
            grads, found_inf_j = env.t2j_iso((g, found_inf))
        params, opt_state = self.optimizer.update(params, grads, opt_state, env)
        buffers = self._roll_fp8(buffers, amax_g, found_inf_j)
        # a skip keeps every leaf the step carries but the scaler's, whatever
        # it holds (parameters, optimizer moments and counts, buffers the
        # forward moved: batch-norm statistics, fp8 amaxes; the random key),
        # taken from the state's own tree: no list to keep up to date
        keep = lambda old, new: jnp.where(found_inf_j, old, new)  # noqa: E731
        params, buffers, opt_state, rng = jax.tree_util.tree_map(
            keep, before, (params, buffers, opt_state, rng))
        with env:
            s = self.scaler.update(env.j2t_iso(scaler_state), env.j2t_iso(found_inf_j))
            scaler_state = env.t2j_iso(s)
        metrics = {"loss": loss, "found_inf": found_inf_j, "scale": scaler_state["scale"]}
        return (params, buffers, opt_state, scaler_state, rng), metrics

    def _roll_fp8(self, buffers, amax_g, found_inf):
        """Delayed fp8 layers: raise pending amax(g), then roll the history
        (xla_amp.fp8's roll; a skipped step leaves history and scale)."""
        if not self._fp8:
            return buffers
        from xla_amp.fp8._history import roll
        env = self.env
        with env:
            b = dict(env.j2t_iso(buffers))
            ag = env.j2t_iso(amax_g)
            skip = None if found_inf is None else env.j2t_iso(found_inf)
            for name, layer in self._fp8:
                pend = b[f"{name}.fp8_amax_pending"]
                pend = torch.cat([pend[:2], torch.maximum(pend[2:], ag[name].reshape(1))])
                hist, scale = roll(layer.recipe, b[f"{name}.fp8_amax_history"], pend,
                                   b[f"{name}.fp8_scale"], skip)
                b[f"{name}.fp8_amax_history"], b[f"{name}.fp8_scale"] = hist, scale
                b[f"{name}.fp8_amax_pending"] = torch.zeros_like(pend)
            return env.t2j_iso(b)

    def __call__(self, *batch):
        """One step on `batch` (inputs..., target); returns the loss (a JAX
        array: reading it is the caller's choice)."""
        self.state, self.metrics = self._jitted(self.state, self.place_batch(*batch))
        return self.metrics["loss"]

    def lower(self, *batch):
        """jax.jit(...).lower for this step's arguments (HLO inspection)."""
        return self._jitted.lower(self.state, self.place_batch(*batch))

    # -- checkpoints -------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything the step carries, as CPU tensors (bit-exact), plus the
        scaler's GradScaler-style state_dict: save it with torch.save and
        read it back with ``weights_only=True``. Across processes every
        process calls it (sharded leaves are gathered: a collective) and
        gets the whole state."""
        params, buffers, opt_state, scaler_state, rng = self.state
        to_t = lambda a: _to_torch(_host(a))  # noqa: E731
        with self.env:
            scaler_sd = self.scaler.state_dict(self.env.j2t_iso(scaler_state))
        return {"model": {k: to_t(v) for k, v in {**params, **buffers}.items()},
                "optimizer": [to_t(a) for a in jax.tree_util.tree_leaves(opt_state)],
                "scaler": scaler_sd, "rng": torch.from_numpy(_host(rng).astype(np.int64))}

    def load_state_dict(self, sd: dict) -> None:
        """Restores `state_dict()`'s output; checks every entry against this
        step's own state first and changes nothing on a mismatch."""
        params, buffers, opt_state, _, rng = self.state
        if not isinstance(sd, dict) or set(sd) != {"model", "optimizer", "scaler", "rng"}:
            raise ValueError("TrainStep.load_state_dict: expected the keys model, optimizer, "
                             "scaler, rng")
        key = sd["rng"]
        if not isinstance(key, torch.Tensor) or tuple(key.shape) != tuple(rng.shape) \
                or key.dtype != torch.int64 or bool(((key < 0) | (key >= 1 << 32)).any()):
            raise ValueError(f"TrainStep.load_state_dict: rng must be an int64 tensor of shape "
                             f"{tuple(rng.shape)} holding uint32 values")
        model = sd["model"]
        expected = {**params, **buffers}
        if set(model) != set(expected):
            diff = sorted(set(model) ^ set(expected))
            raise ValueError(f"TrainStep.load_state_dict: model entries differ: {diff[:5]}")
        for k, a in expected.items():
            _check(f"model[{k!r}]", model[k], a)
        leaves, treedef = jax.tree_util.tree_flatten(opt_state)
        if len(sd["optimizer"]) != len(leaves):
            raise ValueError(f"TrainStep.load_state_dict: the optimizer state has "
                             f"{len(sd['optimizer'])} entries, this step's has {len(leaves)}")
        for i, (t, a) in enumerate(zip(sd["optimizer"], leaves)):
            _check(f"optimizer[{i}]", t, a)
        with self.env:
            scaler_state = {k: v.jax() for k, v in self.scaler.load_state_dict(sd["scaler"]).items()}
        self.state = self._place((
            {k: _to_jax(model[k]) for k in params}, {k: _to_jax(model[k]) for k in buffers},
            jax.tree_util.tree_unflatten(treedef, [_to_jax(t) for t in sd["optimizer"]]),
            scaler_state, jnp.asarray(key.numpy().astype(np.uint32))))


def _put(a, sharding):
    """`a` (a local JAX or NumPy array, the whole value) placed with
    `sharding`. Within one process: jax.device_put. Across processes
    (`sharding` not fully addressable): each process fills only the shards
    its own devices hold, from its own copy (make_array_from_callback) --
    no transfer between processes and no equality check, which
    jax.device_put would make by gathering the whole value from every
    process, and which refuses batches that differ where no device of the
    process reads them. An array already spread over processes is
    resharded by jax.device_put."""
    if sharding.is_fully_addressable or (isinstance(a, jax.Array)
                                         and not a.is_fully_addressable):
        return jax.device_put(a, sharding)
    host = np.asarray(a)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _host(a) -> np.ndarray:
    """The whole of `a` as a NumPy array on this process (bit-exact): read
    locally when this process holds all of it (every element on one of its
    devices: fully addressable, or fully replicated), else gathered from
    every process (process_allgather: a collective every process joins)."""
    if a.is_fully_addressable:
        return np.array(jax.device_get(a))
    if a.is_fully_replicated:
        return np.array(a.addressable_data(0))
    from jax.experimental import multihost_utils
    return np.array(multihost_utils.process_allgather(a, tiled=True))


def _to_torch(host: np.ndarray) -> torch.Tensor:
    """A CPU tensor with `host`'s bits (bfloat16 through its uint16 bits:
    torch.from_numpy does not know ml_dtypes' bfloat16)."""
    if host.dtype == jnp.bfloat16:
        return torch.from_numpy(host.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(host)


def _to_jax(t: torch.Tensor):
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.view(torch.uint16).numpy().view(jnp.bfloat16))
    return jnp.asarray(t.numpy())


def _check(where, t, a):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"TrainStep.load_state_dict: {where} is a {type(t).__name__}, "
                         "not a tensor")
    if tuple(t.shape) != tuple(a.shape) or str(t.dtype).split(".")[-1] != str(a.dtype):
        raise ValueError(f"TrainStep.load_state_dict: {where} is {tuple(t.shape)} "
                         f"{t.dtype}, this step holds {tuple(a.shape)} {a.dtype}")


def make_train_step(model, loss_fn, optimizer, **options) -> TrainStep:
    """Builds a `TrainStep`; options as TrainStep's (policy, dtype, enabled,
    scaler, mesh, sharding, env, backend, seed: the step's random key, by
    default from torch.initial_seed()). The model's parameters are copied
    into JAX: train through the step, read results from ``step.state``."""
    return TrainStep(model, loss_fn, optimizer, **options)
