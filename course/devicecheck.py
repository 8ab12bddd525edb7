"""A GPU stand-in for CPU-only machines: flags every model and tensor a notebook leaves off
`run.device`, where on a GPU it would fail or silently train on the CPU.

The test run sets `SEQ_DEVICE=cpu:0` and `SEQ_DEVICE_CHECK=1` (see `tests/conftest.py`); `setup()`
then calls `install(run.device)`. `cpu:0` is the CPU under another name, so every number is the
same, but a tensor now remembers whether it was sent there: `.to(run.device)`, a factory with
`device=run.device`, or computed from such a tensor. From then on, what fails on a GPU fails
here too, with a message that says what to move:

- an operation that mixes a tensor on run.device with a CPU tensor (a CPU scalar is allowed);
- a module with parameters that runs without having been sent to run.device;
- `.numpy()` (or matplotlib / numpy reading) of a tensor still on run.device: `.cpu()` first;
- a random draw that mixes a generator and a tensor on different devices (a CPU
  `torch.Generator()` with `device=run.device`, or a device tensor's `normal_`/`multinomial`),
  which CUDA refuses: make it with `torch.Generator(device=run.device)` or draw on the CPU;
- a backward pass through a recurrent layer (nn.RNN/LSTM/GRU) run in eval mode, which cuDNN
  refuses (CPU kernels allow it), through its outputs or its final states (h_n, c_n).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

MARK = "_seq_on_run_device"
_installed: list = []


class DevicePlacementError(RuntimeError):
    """A model or tensor is on the wrong device for the operation (it would fail on a GPU)."""


def on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, MARK, False)


def _mark(value, flag: bool = True):
    for t in tree_flatten(value)[0]:
        if isinstance(t, torch.Tensor):
            try:
                setattr(t, MARK, flag)
            except (AttributeError, RuntimeError):  # a few internal tensor types take no attributes
                pass
    return value


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


# operations that may mix devices on a GPU too (copies, metadata, packing's CPU lengths)
PASS_THROUGH = {"__set__", "__repr__", "__format__", "__len__", "__bool__", "__iter__",
                "__hash__", "dim", "size", "numel", "is_floating_point", "item", "tolist",
                "__setitem__", "copy_", "set_", "_has_compatible_shallow_copy_type"}
PACKING = {"_pack_padded_sequence", "_pad_packed_sequence"}
RECURRENT = {"lstm", "gru", "rnn_tanh", "rnn_relu"}


DEVICE_GETTER, GRAD_GETTER = torch.Tensor.device.__get__, torch.Tensor.grad.__get__
CPU_GENERATOR = torch.Generator  # the real class; `install` puts TrackedGenerator in its place


class TrackedGenerator(CPU_GENERATOR):
    """`torch.Generator` while the check is installed: it remembers whether it was made for
    run.device (one made with device="cpu:0" reports "cpu", so the device alone cannot tell) and
    reports run.device then, as a GPU generator would."""

    def __new__(cls, device="cpu"):
        generator = super().__new__(cls, device=device)
        generator.on_run_device = bool(_installed) and torch.device(device) == _installed[0].target
        return generator

    @property
    def device(self) -> torch.device:
        return _installed[0].target if getattr(self, "on_run_device", False) else CPU_GENERATOR.device.__get__(self)


class _Check(TorchFunctionMode):
    """Runs every torch operation and keeps track of which tensors are on `target`."""

    def __init__(self, target: torch.device) -> None:
        super().__init__()
        self.target = target

    def _is_target(self, device) -> bool:
        try:
            return torch.device(device) == self.target
        except (TypeError, RuntimeError):
            return False

    def _move_target(self, args, kwargs):
        """Where a `.to(...)` call sends its tensor: True (run.device), False (the CPU), None (no move)."""
        for a in list(args[1:]) + list(kwargs.values()):
            if isinstance(a, torch.Tensor):
                return on_device(a)
            if isinstance(a, (str, torch.device)):
                return self._is_target(a)
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func == DEVICE_GETTER:  # a tensor on run.device says so, so `device=x.device` follows it
            return self.target if on_device(args[0]) else func(*args, **kwargs)
        if func == GRAD_GETTER:  # autograd writes gradients where their parameter lives
            return _mark(func(*args, **kwargs), on_device(args[0]))
        if name == "__set__" and len(args) == 2 and isinstance(args[1], torch.Tensor):
            _mark(args[0], on_device(args[1]))  # `param.data = moved`, as Module.to does
        if name in ("__get__", "__deepcopy__"):  # properties (x.T, x.data) and copies keep the place
            out = func(*args, **kwargs)
            return _mark(out, on_device(args[0])) if isinstance(out, torch.Tensor) else out
        if name in PASS_THROUGH:
            return func(*args, **kwargs)
        if name in PACKING:  # data on the device, batch sizes on the CPU: as on a GPU
            out = func(*args, **kwargs)
            _mark(out[0], on_device(args[0]))
            return out
        if name in ("numpy", "__array__") and on_device(args[0]):
            raise DevicePlacementError(
                f"`{name}` of a tensor on run.device {_describe(args[0])}: on a GPU this fails. "
                "Bring it back first: `x.cpu()` (or `.item()` / `.tolist()` for numbers)")
        if name in ("to", "cpu"):
            return self._to(func, name, args, kwargs)
        leaves = tree_flatten((args, kwargs))[0]
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        moved = [t for t in tensors if on_device(t)]
        host = [t for t in tensors if not on_device(t) and t.dim() > 0]
        if name == "__getitem__" and tensors and on_device(tensors[0]):
            host = []  # a device tensor may be indexed with CPU indices
        if name in RECURRENT:  # a packed sequence's batch sizes live on the CPU, also on a GPU
            host = [t for t in host if t.is_floating_point()]
        if moved and host:
            raise DevicePlacementError(
                f"`{name}` mixes a tensor on run.device {_describe(moved[0])} with a CPU tensor "
                f"{_describe(host[0])}: on a GPU this fails. Send the CPU one to run.device "
                "(`x.to(run.device)`), or create it there (`device=run.device`)")
        created_there = "device" in kwargs and self._is_target(kwargs["device"])
        for g in leaves:
            if isinstance(g, CPU_GENERATOR) and getattr(g, "on_run_device", False) != bool(moved or created_there):
                where = ("a CPU generator for a tensor on run.device" if moved or created_there
                         else "a generator on run.device for a CPU tensor")
                raise DevicePlacementError(
                    f"`{name}` draws with {where}: on a GPU this fails ('Expected a cuda device "
                    "type for generator'). Make the generator where the tensor is "
                    "(`torch.Generator(device=run.device)`), or draw on the CPU and move the result")
        out = func(*args, **kwargs)
        if moved or created_there:
            _mark(out)
        return out

    def _to(self, func, name, args, kwargs):
        """`.to(run.device)` marks a copy; `.cpu()` / `.to("cpu")` gives an unmarked copy. Both
        copy, as a real device move would, so the tensor left behind keeps its place."""
        target = False if name == "cpu" else self._move_target(args, kwargs)
        out = func(*args, **kwargs)
        src = args[0]
        if target is None or not isinstance(out, torch.Tensor):
            return _mark(out, on_device(src)) if isinstance(out, torch.Tensor) else out
        if out is src and not isinstance(src, nn.Parameter) and on_device(src) != target:
            with torch._C.DisableTorchFunction():
                out = src.clone()  # a move gives a new tensor; the original stays where it was
        return _mark(out, target)


def _module_placed(module: nn.Module, args) -> None:
    for name, p in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
        if not on_device(p) and p.dim() > 0:
            raise DevicePlacementError(
                f"{type(module).__name__} runs with its {name} {_describe(p)} still on the CPU: "
                "on a GPU it would train and run on the CPU (or fail). Send the model to the "
                "device: `model.to(run.device)`")


def _cudnn_rnn_rule(module: nn.Module, args, output) -> None:
    """cuDNN cannot backpropagate through a recurrent layer that ran in eval mode."""
    if not isinstance(module, nn.RNNBase) or module.training or not torch.is_grad_enabled():
        return
    def refuse(grad):
        raise DevicePlacementError(
            f"backward through {type(module).__name__} run in eval mode: cuDNN refuses it on a "
            "GPU ('cudnn RNN backward can only be called in training mode'). Take such "
            "gradients in train mode, with dropout off")

    # every output: the per-step states (a PackedSequence's data too) and the final h_n, c_n
    for out in tree_flatten(output)[0]:
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(refuse)


def install(device: torch.device) -> None:
    """Start checking placement against `device` (once per process; `remove` stops it)."""
    if _installed:
        return
    mode = _Check(torch.device(device))
    mode.__enter__()  # active for the rest of the session
    torch.Generator = TrackedGenerator
    _installed.extend([mode, nn.modules.module.register_module_forward_pre_hook(_module_placed),
                       nn.modules.module.register_module_forward_hook(_cudnn_rnn_rule)])


def remove() -> None:
    """Stop checking (the unit tests switch the check on and off around each case)."""
    if _installed:
        mode, *hooks = _installed
        mode.__exit__(None, None, None)
        torch.Generator = CPU_GENERATOR
        for hook in hooks:
            hook.remove()
        _installed.clear()
