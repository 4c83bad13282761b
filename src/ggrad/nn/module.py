"""`Module`: parameters and sub-modules registered by attribute, state dicts, modes."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterator, NamedTuple

import numpy as np

from .. import capture, runtime
from ..autograd import no_grad
from ..tensor import Tensor, param


def Parameter(data) -> Tensor:
    """A trainable tensor (PyTorch's spelling of `ggrad.param`)."""
    return param(data.numpy() if isinstance(data, Tensor) else data)


class IncompatibleKeys(NamedTuple):
    """What `load_state_dict` found missing or unexpected (torch's `_IncompatibleKeys`)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class StateDictError(ValueError, RuntimeError):
    """A state dict that does not fit (torch raises RuntimeError, ggrad ValueError: both catch it)."""


def _hooks_changed() -> None:
    """A compiled step replays the hooks its trace ran: adding or removing one makes every
    capture stale, so the next call traces again (torch.compile guards on hooks too). A
    hook added or removed inside a traced step is part of what that step did."""
    if not capture.tracing():
        capture.invalidate()


class RemovableHandle:
    """Returned by the hook registrations: `remove()` takes the hook out."""

    def __init__(self, hooks: OrderedDict, key: int) -> None:
        self._hooks, self._key = hooks, key

    def remove(self) -> None:
        if self._hooks.pop(self._key, None) is not None:
            _hooks_changed()

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


_hook_ids = iter(range(1 << 62))


class Module:
    """Base class: assign parameters (tensors that require grad), buffers and modules as
    attributes; `forward` does the work, calling the module calls `forward` (between the
    forward pre-hooks and hooks)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"call Module.__init__() in {type(self).__name__}.__init__ before assigning {name!r}")
        old = self.__dict__.get(name)
        if isinstance(old, (Tensor, Module)) and old is not value:
            capture.invalidate()  # a captured step would still read the replaced one
        if isinstance(value, Module):
            home = self._modules
        elif isinstance(value, Tensor) and value.requires_grad:
            home = self._parameters
        elif isinstance(value, Tensor) and name in self.__dict__.get("_buffer_names", ()):
            home = self._buffers
        else:
            home = None
        for table in (self._parameters, self._buffers, self._modules):
            if table is not home:
                table.pop(name, None)
        if home is not None:
            home[name] = value  # a replacement keeps its place in the state dict, as torch's
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """State that is not trained (BatchNorm's running stats); saved and loaded with the
        state dict unless `persistent` is False."""
        self.__dict__.setdefault("_buffer_names", set()).add(name)
        (self._non_persistent.discard if persistent else self._non_persistent.add)(name)
        setattr(self, name, tensor)

    def register_parameter(self, name: str, parameter: Tensor | None) -> None:
        if parameter is not None and not parameter.requires_grad:
            raise TypeError(f"parameter {name!r} must require grad (make it with nn.Parameter or ggrad.param)")
        setattr(self, name, parameter)

    def add_module(self, name: str, module: Module | None) -> None:
        setattr(self, name, module)

    def register_forward_pre_hook(self, hook: Callable) -> RemovableHandle:
        """`hook(module, args)` runs before forward; a non-None result replaces args."""
        key = next(_hook_ids)
        self._forward_pre_hooks[key] = hook
        _hooks_changed()
        return RemovableHandle(self._forward_pre_hooks, key)

    def register_forward_hook(self, hook: Callable) -> RemovableHandle:
        """`hook(module, args, output)` runs after forward; a non-None result replaces output."""
        key = next(_hook_ids)
        self._forward_hooks[key] = hook
        _hooks_changed()
        return RemovableHandle(self._forward_hooks, key)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward")

    def __call__(self, *args, **kwargs):
        capture.keep_flag(self, "training")  # a captured step replays this mode's forward only
        for hook in list(self._forward_pre_hooks.values()):
            changed = hook(self, args)
            if changed is not None:
                args = changed if isinstance(changed, tuple) else (changed,)
        output = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            changed = hook(self, args, output)
            if changed is not None:
                output = changed
        return output

    # ---- traversal -------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, module in self._modules.items():
            yield from module.named_modules(f"{prefix}.{name}" if prefix else name)

    def get_submodule(self, target: str) -> Module:
        """The module at dotted path `target` ("" is this one), as torch's."""
        module = self
        for part in target.split(".") if target else ():
            child = module._modules.get(part)
            if child is None:
                raise AttributeError(f"{type(module).__name__} has no submodule {part!r} (looking for {target!r})")
            module = child
        return module

    def set_submodule(self, target: str, module: Module) -> None:
        """Put `module` at dotted path `target` in place of what is there, as torch's."""
        parent, _, name = target.rpartition(".")
        self.get_submodule(parent).add_module(name, module)

    def modules(self) -> Iterator[Module]:
        return (m for _, m in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter(self._modules.items())

    def children(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def _members(self, table: str, recurse: bool):
        modules = self.named_modules() if recurse else iter([("", self)])
        for prefix, module in modules:
            for name, value in getattr(module, table).items():
                yield (f"{prefix}.{name}" if prefix else name), value, module, name

    def named_parameters(self, recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        for key, p, _, _ in self._members("_parameters", recurse):
            if id(p) not in seen:
                seen.add(id(p))
                yield key, p

    def parameters(self, recurse: bool = True) -> Iterator[Tensor]:
        return (p for _, p in self.named_parameters(recurse))

    def named_buffers(self, recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        for key, b, _, _ in self._members("_buffers", recurse):
            yield key, b

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        return (b for _, b in self.named_buffers(recurse))

    def apply(self, fn: Callable[[Module], None]) -> Module:
        """`fn` on every sub-module (children first) and then on this one, as torch's."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Freeze (False) or unfreeze every parameter; frozen ones stay parameters."""
        for p in self.parameters():
            p.requires_grad = bool(requires_grad)
        capture.invalidate()
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                with no_grad():
                    p.grad.zero_()

    # ---- modes -------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def to(self, *args, dtype=None, device=None) -> Module:
        """``to(device)``: ggrad runs one device at a time, so this makes `device` current
        (the previous one's data moves to the host first, nothing lost) and places this
        module's tensors on it. ``to(dtype)``: floating-point parameters and buffers are
        converted in place (the same Tensor objects, as torch's)."""
        from .. import dtypes
        from ..tensor import _is_dtype_name, realize
        for a in args:
            if isinstance(a, str) and not _is_dtype_name(a):
                device = a
            else:
                dtype = a
        tensors = [*self.parameters(), *(b for _, b in self.named_buffers())]
        if device is not None:
            runtime.set_device(device)
            realize(*tensors)
            for t in tensors:
                t.handle  # noqa: B018  (uploads what is still on the host)
        if dtype is not None:
            dtype = dtypes.as_dtype(dtype)
            if not dtype.is_floating_point:
                raise TypeError(f"Module.to converts floating-point tensors to floating-point dtypes, got {dtype}")
            with no_grad():
                for t in tensors:
                    if t.dtype.is_floating_point and t.dtype is not dtype:
                        converted = t.detach().to(dtype)
                        converted.node.scope = "persistent"
                        t.node, t._grad = converted.node, None
            realize(*tensors)
            capture.invalidate()
        return self

    def half(self) -> Module:
        from .. import dtypes
        return self.to(dtypes.float16)

    def bfloat16(self) -> Module:
        from .. import dtypes
        return self.to(dtypes.bfloat16)

    def float(self) -> Module:
        from .. import dtypes
        return self.to(dtypes.float32)

    # ---- state -------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, Tensor]:
        """Each module's parameters, then its persistent buffers, module after module (torch's
        keys and order); a parameter shared by two modules (tied weights) is listed under
        both names, as torch's."""
        state: OrderedDict[str, Tensor] = OrderedDict()
        for prefix, module in self.named_modules():
            for name, p in module._parameters.items():
                state[f"{prefix}.{name}" if prefix else name] = p
            for name, b in module._buffers.items():
                if name not in module._non_persistent:
                    state[f"{prefix}.{name}" if prefix else name] = b
        return state

    def load_state_dict(self, state: dict, strict: bool = True) -> IncompatibleKeys:
        """Copy values in place (same buffers). Every name, shape and dtype is checked
        before anything changes; a mismatch raises naming all the offending keys. Returns
        the missing and unexpected keys, as torch's (with strict=False they are allowed).
        A missing BatchNorm `num_batches_tracked` is not an error (torch's own tolerance
        for state dicts written before it existed), nor a tied weight given under one of
        its names (ggrad's state dicts listed it once before they listed it as torch's)."""
        own = self.state_dict()
        values = {k: (v.numpy() if isinstance(v, Tensor) else np.asarray(v)) for k, v in state.items()}
        given = {id(t) for k, t in own.items() if k in values}  # a tied weight given under one of its names
        missing = [k for k in own if k not in values and not k.endswith("num_batches_tracked") and id(own[k]) not in given]
        unexpected = [k for k in values if k not in own]
        shapes = [f"{k}: expected {own[k].shape}, got {values[k].shape}" for k in own
                  if k in values and tuple(values[k].shape) != own[k].shape]
        dtypes = [f"{k}: expected {own[k].dtype}, got {values[k].dtype}" for k in own
                  if k in values and values[k].dtype.kind != own[k].dtype.host.kind]
        problems = []
        if strict and missing:
            problems.append(f"missing keys: {missing}")
        if strict and unexpected:
            problems.append(f"unexpected keys: {unexpected}")
        if shapes:
            problems.append(f"mis-shaped keys: {shapes}")
        if dtypes:
            problems.append(f"wrong dtypes: {dtypes}")
        if problems:
            raise StateDictError(f"load_state_dict for {type(self).__name__}: " + "; ".join(problems))
        with no_grad():
            for k, t in own.items():
                if k in values:
                    t.assign_(values[k])
        return IncompatibleKeys(missing, unexpected)

    # ---- printing ----------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


class Sequential(Module):
    """Modules called in order; named 0, 1, ... or by an OrderedDict's keys, as torch's."""

    def __init__(self, *layers) -> None:
        super().__init__()
        named = layers[0].items() if len(layers) == 1 and isinstance(layers[0], OrderedDict) \
            else ((str(i), layer) for i, layer in enumerate(layers))
        for name, layer in named:
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential takes Modules, got {type(layer).__name__} at {name}")
            setattr(self, name, layer)

    def forward(self, x):
        for layer in self._modules.values():
            x = layer(x)
        return x

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)


class ModuleList(Module):
    def __init__(self, modules=()) -> None:
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        setattr(self, str(len(self._modules)), module)
        return self

    def extend(self, modules) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)


class ModuleDict(Module):
    def __init__(self, modules: dict | None = None) -> None:
        super().__init__()
        for k, m in (modules or {}).items():
            setattr(self, k, m)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        setattr(self, key, module)

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def __len__(self) -> int:
        return len(self._modules)

    def values(self):
        return self._modules.values()

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules


class ParameterList(Module):
    """Parameters kept in a list, registered as 0, 1, ... (torch's state-dict keys)."""

    def __init__(self, values=()) -> None:
        super().__init__()
        for v in values:
            self.append(v)

    def append(self, value) -> ParameterList:
        setattr(self, str(len(self._parameters)), value if isinstance(value, Tensor) else Parameter(value))
        return self

    def __getitem__(self, i: int) -> Tensor:
        return list(self._parameters.values())[i]

    def __iter__(self):
        return iter(self._parameters.values())

    def __len__(self) -> int:
        return len(self._parameters)


capture.RETURNED_AS_IS.append(Module)  # ggrad.compile(model) is the model (see ggrad.compile)
