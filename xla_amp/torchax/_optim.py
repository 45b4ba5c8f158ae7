"""Optimizers a jitted torchax step can run: optax transformations and
torch.optim optimizers. One function picks the path (`adapter`).

    optax:        state = opt.init(params); updates, state = opt.update(grads,
                  state, params); params = optax.apply_updates(params, updates)
    torch.optim:  the optimizer's own step() on torchax tensors, traced once:
                  the same class and param groups (hyper-parameters), built
                  with foreach=False (torchax has no _foreach_ lowerings) and
                  capturable=True where the class takes it (no .item() on the
                  step count); state passed in and out as arrays. The state
                  starts as torch's lazy init makes it (zeros, step 0), so
                  SGD with dampening != 0 is refused (its first step differs).
    refused:      xla_amp.syncfree optimizers (torch_xla kernels), anything
                  else, each with its name.
"""
from __future__ import annotations

import inspect

import jax
import torch


class _Optax:
    def __init__(self, opt):
        self.opt = opt
        self.name = "optax"

    def init(self, params, env):
        return self.opt.init(params)

    def update(self, params, grads, state, env):
        import optax
        updates, state = self.opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state


class _TorchOptim:
    def __init__(self, optimizer: torch.optim.Optimizer, names_by_id: dict[int, str]):
        cls = type(optimizer)
        if cls.__module__.startswith("xla_amp.syncfree"):
            raise ValueError(
                f"make_train_step: {cls.__name__} is an xla_amp.syncfree optimizer (torch_xla "
                "kernels); on torchax use its torch.optim counterpart or an optax optimizer")
        accepted = inspect.signature(cls.__init__).parameters
        self.cls = cls
        self.name = cls.__name__
        self.groups = []
        for i, group in enumerate(optimizer.param_groups):
            names = []
            for p in group["params"]:
                if id(p) not in names_by_id:
                    raise ValueError(f"make_train_step: {cls.__name__} param group {i} holds a "
                                     "tensor that is not a parameter of the model")
                names.append(names_by_id[id(p)])
            hyper = {k: v for k, v in group.items() if k != "params" and k in accepted}
            if "foreach" in accepted:
                hyper["foreach"] = False
            if "fused" in accepted:
                hyper["fused"] = None
            if "capturable" in accepted:
                hyper["capturable"] = True
            if hyper.get("dampening", 0) != 0:
                raise ValueError("make_train_step: SGD with dampening != 0 is not supported "
                                 "(its first step differs from the zero-initialised state)")
            self.groups.append((names, hyper))
        if any(optimizer.state.values()):
            raise ValueError(f"make_train_step: the {cls.__name__} already holds state; build "
                             "the step before training (resume through load_state_dict)")

    def _run(self, params, grads, state, env):
        with env:
            tensors = {k: env.j2t_iso(v) for k, v in params.items()}
            groups = [{"params": [tensors[n] for n in names], **hyper}
                      for names, hyper in self.groups]
            opt = self.cls(groups)
            for name, t in tensors.items():
                t.grad = env.j2t_iso(grads[name])
                if state is not None:
                    opt.state[t] = {k: env.j2t_iso(v) for k, v in state[name].items()}
            opt.step()
            new_params = {k: t.jax() for k, t in tensors.items()}
            new_state = {k: {n: v.jax() for n, v in opt.state[t].items()}
                         for k, t in tensors.items()}
        return new_params, new_state

    def init(self, params, env):
        shapes = jax.eval_shape(lambda p: self._run(p, p, None, env)[1], params)
        return jax.tree_util.tree_map(lambda s: jax.numpy.zeros(s.shape, s.dtype), shapes)

    def update(self, params, grads, state, env):
        return self._run(params, grads, state, env)


def adapter(optimizer, names_by_id: dict[int, str]):
    """The update path for `optimizer`; ValueError naming anything else."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return _TorchOptim(optimizer, names_by_id)
    if callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None)):
        return _Optax(optimizer)
    raise ValueError(f"make_train_step: optimizer must be an optax GradientTransformation or a "
                     f"torch.optim.Optimizer, got {type(optimizer).__name__}")
