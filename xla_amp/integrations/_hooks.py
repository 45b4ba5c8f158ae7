"""What every integration does at each point of a training step, for one
:class:`~xla_amp.integrations._mode.Mode`. The framework classes
(Lightning's plugins, the Accelerate and Transformers hooks) only say
*when*: each of their hooks calls one method here::

    convert_module(model)     bf16-true: cast_module(model, bf16, keep);
                              module_policies(model, rules) if given
    autocast()                xla_amp.autocast(device, compute dtype, policy)
    convert_input(batch)      bf16-true: floating tensors -> bf16
    scale(loss)               16-mixed: scaler.scale(loss); else loss
    reduce_gradients(opt)     mean over replicas (a world of one: nothing)
    unscale(opt)              16-mixed: scaler.unscale_(opt) (for clipping)
    step(opt)                 xla_amp.optimizer_step(opt, scaler): reduce,
                              scaler.step + update | opt.step(); the skip
                              decided on the device, no transfer
    state_dict()              the scaler's (a framework checkpoint keeps it)
"""
from __future__ import annotations

import weakref

import torch
import torch_xla
import torch_xla.core.xla_model as xm

import xla_amp
from xla_amp import policies
from xla_amp._param_walk import check_on_xla
from xla_amp.integrations import _optimizers
from xla_amp.integrations._mode import Mode, check_dtype
from xla_amp.precision import cast_module, module_policies


class Hooks:
    """The runtime side of a :class:`Mode`: owns the ``GradScaler``
    (``"16-mixed"``) and the module-policy handles it installed."""

    def __init__(self, mode: Mode):
        self.mode = mode
        self.scaler = xla_amp.GradScaler(**mode.scaler) if mode.scaled else None
        self._handles: list = []
        self._checked: set[int] = set()
        self._converted: weakref.WeakSet = weakref.WeakSet()
        self._optimizers: weakref.WeakSet = weakref.WeakSet()  # fp8: rolled after their steps
        self._fp8_attached: set[tuple[int, int]] = set()

    # -- the model ------------------------------------------------------------

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Give ``module`` the mode's parameter dtype and module policies
        (once per module: a framework may hand the same one over twice)."""
        if module in self._converted:
            return module
        if self.mode.param_dtype != torch.float32:
            cast_module(module, self.mode.param_dtype, keep=self.mode.keep)
        if self.mode.fp8 is not None:
            _convert_fp8(module, self.mode.fp8)
        if self.mode.module_policies:
            self._handles.append(module_policies(module, self.mode.module_policies))
        self._converted.add(module)
        self._attach_fp8()
        return module

    def track_optimizer(self, optimizer) -> None:
        """fp8: `optimizer`'s steps roll the converted modules' amax
        histories (``xla_amp.fp8.attach``; a step the GradScaler skips leaves
        them). Called for every optimizer the framework hands over."""
        self._optimizers.add(optimizer)
        self._attach_fp8()

    def _attach_fp8(self) -> None:
        if self.mode.fp8 is None or self.mode.fp8.scaling != "delayed":
            return
        from xla_amp import fp8
        for opt in list(self._optimizers):
            for module in list(self._converted):
                key = (id(opt), id(module))
                if key not in self._fp8_attached:
                    fp8.attach(opt, module)
                    self._fp8_attached.add(key)

    def autocast(self, device=None) -> xla_amp.autocast:
        """The forward's region on ``device`` (default: this process's XLA
        device). A device whose policy lacks the compute dtype (16-mixed on a
        TPU) is refused here, not left to autocast's warn-and-disable."""
        device = torch_xla.device() if device is None else torch.device(device)
        policy = self.mode.policy
        if policy is None:
            policy = policies.for_hardware(xm.xla_device_hw(device))
            check_dtype(policy, self.mode.compute_dtype, self.mode.precision)
        return xla_amp.autocast(device, dtype=self.mode.compute_dtype, policy=policy)

    def convert_input(self, data):
        """bf16-true: floating tensors in ``data`` (any nesting) to bf16, so
        they meet bf16 weights; other modes: ``data`` unchanged."""
        if self.mode.param_dtype == torch.float32:
            return data
        dtype = self.mode.param_dtype
        return torch.utils._pytree.tree_map(
            lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
            data)

    # -- the step -----------------------------------------------------------

    def check_mode(self, optimizer) -> None:
        """``_optimizers.check`` once per optimizer."""
        if id(optimizer) not in self._checked:
            _optimizers.check(optimizer, self.mode)
            self._checked.add(id(optimizer))
            self.track_optimizer(optimizer)

    def check_optimizer(self, optimizer) -> None:
        """Everything a step needs of ``optimizer``, checked before a
        framework runs its closure: it fits the mode (``check_mode``), and
        its parameters are on the XLA device now (every call: a param group
        can change between steps)."""
        self.check_mode(optimizer)
        check_on_xla(optimizer, "xla_amp")

    def adopt(self, optimizers: list) -> list:
        """The optimizers this mode trains with: each one's syncfree
        namesake where one exists (see ``_optimizers``). All are checked
        before any is changed."""
        for opt in optimizers:
            if not _optimizers.swappable(opt):
                self.check_mode(opt)
        adopted = [_optimizers.to_syncfree(opt, self.mode) for opt in optimizers]
        for opt in adopted:
            self.check_mode(opt)
        return adopted

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    @staticmethod
    def reduce_gradients(optimizer) -> None:
        xla_amp.all_reduce_gradients(optimizer)

    def unscale(self, optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer, *, reduce: bool = True, **kwargs):
        """The optimizer step with the mode's scaling, through
        ``xla_amp.optimizer_step`` (gradients mean-reduced over replicas
        unless ``reduce=False`` says the caller did; one skip decision for
        all). Call once per iteration, after backward. ``optimizer_step``
        refuses parameters off the XLA device before it changes anything."""
        self.check_mode(optimizer)
        return xla_amp.optimizer_step(optimizer, scaler=self.scaler, optimizer_args=kwargs,
                                      reduce_gradients=reduce)

    # -- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None:
            self.scaler.load_state_dict(state)
        elif state:
            raise ValueError(f"precision={self.mode.precision!r} keeps no scaler state, "
                             f"but the checkpoint holds {sorted(state)}: it was saved "
                             "under '16-mixed'")

    def teardown(self) -> None:
        """Take the module policies out again."""
        while self._handles:
            self._handles.pop().remove()


def _convert_fp8(module: torch.nn.Module, recipe) -> None:
    """fp8.convert, unless the model was converted already (Lightning loads
    a checkpoint's weights before the plugin sees the model, so a resumed
    run converts in ``configure_model``): then every converted layer must
    carry the mode's recipe."""
    from xla_amp import fp8
    done = [(n, m) for n, m in module.named_modules() if isinstance(m, fp8.Fp8Linear)]
    if not done:
        fp8.convert(module, recipe)
        return
    for name, layer in done:
        if layer.recipe != recipe:
            raise ValueError(f"fp8: layer {name!r} was converted with {layer.recipe}, but the "
                             f"precision setting asks for {recipe}")
