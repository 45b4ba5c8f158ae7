"""The Python half of ``autocast(record=True)``: which module is running.

The engine counts its decisions per innermost module (csrc/autocast/
recorder.h); only Python knows which module runs, so while any recording
region is open, global module hooks tell the engine::

    forward pre-hook  (module):  name = qualified name under the outermost
                                 module running on this thread (the root,
                                 named ""; a module called outside the
                                 root's tree: its class name);
                                 push(name)
    forward hook (always, also on exceptions): pop, if this module pushed

The hooks are installed when the first recording region opens (any thread)
and removed when the last one closes, so without recording no hook runs.
"""
from __future__ import annotations

import threading

import torch

from xla_amp import _engine

_lock = threading.Lock()
_open = 0          # recording regions open, all threads
_handles: list = []
_tls = threading.local()  # .depth: recording regions open here; .stack; .names


def _state():
    if not hasattr(_tls, "depth"):
        _tls.depth, _tls.stack, _tls.names = 0, [], {}
    return _tls


def begin(recorder) -> object:
    """Makes `recorder` the calling thread's; returns what `end` restores."""
    global _open
    tls = _state()
    previous = _engine.set_recorder(recorder)
    tls.depth += 1
    with _lock:
        if _open == 0:
            # compiled code reaching a hook runs it eagerly (it talks to _C)
            _handles.append(torch.nn.modules.module.register_module_forward_pre_hook(
                torch.compiler.disable(_pre)))
            _handles.append(torch.nn.modules.module.register_module_forward_hook(
                torch.compiler.disable(_post), always_call=True))
        _open += 1
    return previous


def end(previous) -> None:
    """Gives the thread `previous` back; a region nested in another
    recording one hands its rows to it (the outer report covers all)."""
    global _open
    tls = _state()
    finished = _engine.set_recorder(previous)
    if previous is not None and finished is not None:
        previous.merge_from(finished)
    tls.depth -= 1
    if tls.depth == 0:
        while tls.stack:  # a region closed inside a module's forward
            tls.stack.pop()
            _engine.pop_module()
        tls.names = {}
    with _lock:
        _open -= 1
        if _open == 0:
            for handle in _handles:
                handle.remove()
            _handles.clear()


def _name(tls, module) -> str:
    if not tls.stack and id(module) not in tls.names:
        # a new root: names of its whole tree, looked up by identity
        tls.names = {}
        for name, m in module.named_modules(remove_duplicate=False):
            tls.names.setdefault(id(m), name)  # a shared module: its first name
    name = tls.names.get(id(module))
    return name if name is not None else type(module).__name__


def _pre(module, args):
    tls = _state()
    if tls.depth == 0:
        return
    name = _name(tls, module)
    tls.stack.append(module)
    _engine.push_module(name)


def _post(module, args, output):
    tls = _state()
    if tls.depth and tls.stack and tls.stack[-1] is module:
        tls.stack.pop()
        _engine.pop_module()
