"""torch.utils.tensorboard for ggrad: a `SummaryWriter` that writes TensorBoard's event
files through tensorboardX's writer, takes ggrad tensors where it takes arrays, and draws
a model's graph from ggrad's own record of one forward pass (`add_graph`)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from .. import autograd, lazy
from ..tensor import Tensor

try:
    import tensorboardX
    from tensorboardX.proto import attr_value_pb2, event_pb2, graph_pb2, node_def_pb2, tensor_shape_pb2, versions_pb2
except ImportError as missing:  # pragma: no cover - the message is the behaviour
    raise ImportError("ggrad.utils.tensorboard writes through tensorboardX: pip install 'ggrad[tensorboard]' "
                      "(or tensorboardX)") from missing


def _host(value):
    """A ggrad tensor (or a dict or list of them) as the numpy values tensorboardX takes:
    one read of each tensor."""
    if isinstance(value, Tensor):
        array = value.numpy()
        array = array if array.dtype.kind in "biuf" else array.astype(np.float32)  # bfloat16
        return array if array.ndim else array.item()
    if isinstance(value, dict):
        return {k: _host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
        return type(value)(_host(v) for v in value)
    return value


def _taking_tensors(method: Callable) -> Callable:
    @functools.wraps(method)
    def converted(self, *args, **kwargs):
        return method(self, *[_host(a) for a in args], **{k: _host(v) for k, v in kwargs.items()})
    return converted


class SummaryWriter(tensorboardX.SummaryWriter):
    """torch's (and tensorboardX's) SummaryWriter: ``SummaryWriter(log_dir=None)`` writes
    under ``runs/<date>_<host>``. Values may be ggrad tensors (each is read once)."""

    def add_graph(self, model, input_to_model=None, verbose: bool = False) -> None:
        """Draw `model`'s graph: the ggml-level ops of one forward pass on `input_to_model`
        (a tensor, an array, or a tuple of them), grouped by the module that ran them, as
        torch's add_graph groups its traced ops. The pass is recorded in eval mode and never
        run: nothing is computed, no random number is drawn and no running statistic moves."""
        if input_to_model is None:
            raise ValueError("add_graph needs input_to_model: ggrad draws the ops of one forward pass on it")
        graph = model_graph(model, input_to_model)
        if verbose:
            print(graph)
        self._get_file_writer().add_event(event_pb2.Event(graph_def=graph.SerializeToString()))


for _name in ("add_scalar", "add_scalars", "add_histogram", "add_histogram_raw", "add_image", "add_images",
              "add_embedding", "add_pr_curve", "add_hparams", "add_text"):
    setattr(SummaryWriter, _name, _taking_tensors(getattr(tensorboardX.SummaryWriter, _name)))


def _scopes(model) -> dict[int, str]:
    """Each module's TensorBoard scope, torch's style: ``Net/Linear[fc1]``."""
    scopes: dict[int, str] = {}
    by_path: dict[str, str] = {}
    for path, module in model.named_modules():
        if not path:
            scope = type(model).__name__
        else:
            parent, _, name = path.rpartition(".")
            scope = f"{by_path[parent]}/{type(module).__name__}[{name}]"
        by_path[path] = scopes.setdefault(id(module), scope)
    return scopes


def _attr_shape(shape: tuple[int, ...]) -> attr_value_pb2.AttrValue:
    dims = [tensor_shape_pb2.TensorShapeProto.Dim(size=int(d)) for d in shape]
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
        shape=[tensor_shape_pb2.TensorShapeProto(dim=dims)]))


def _recording_spans(model) -> tuple[list[tuple[int, int, str]], list]:
    """Hooks on every module that note where in recording order each call began and
    ended, with its scope: (spans, the hooks' handles)."""
    scopes = _scopes(model)
    spans: list[tuple[int, int, str]] = []
    opened: list[int] = []

    def begin(module, args) -> None:
        opened.append(lazy.mark())

    def end(module, args, output) -> None:
        spans.append((opened.pop(), lazy.mark(), scopes[id(module)]))
    handles = []
    for module in model.modules():
        handles += [module.register_forward_pre_hook(begin), module.register_forward_hook(end)]
    return spans, handles


def _named_leaves(model, inputs: tuple[Tensor, ...]) -> dict[int, tuple[str, str]]:
    """The forward's leaves that have names: id(node) -> (name, kind)."""
    scopes = _scopes(model)
    named = {id(x.node): (f"input/{i}" if len(inputs) > 1 else "input", "Input") for i, x in enumerate(inputs)}
    for m in model.modules():
        for kind, tensors in (("Parameter", m._parameters), ("Buffer", getattr(m, "_buffers", {}))):
            for name, t in tensors.items():
                if isinstance(t, Tensor):
                    named.setdefault(id(t.node), (f"{scopes[id(m)]}/{name}", kind))
    return named


def model_graph(model, input_to_model) -> graph_pb2.GraphDef:
    """The GraphDef of one forward pass of `model` (see `SummaryWriter.add_graph`)."""
    inputs = input_to_model if isinstance(input_to_model, (tuple, list)) else (input_to_model,)
    inputs = tuple(x if isinstance(x, Tensor) else Tensor(np.asarray(x)) for x in inputs)
    spans, handles = _recording_spans(model)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with autograd.no_grad():
            output = model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
        for m, training in modes:
            object.__setattr__(m, "training", training)
    outputs = [t for t in (output if isinstance(output, (tuple, list)) else (output,)) if isinstance(t, Tensor)]
    named = _named_leaves(model, inputs)
    innermost = sorted(spans, key=lambda span: -span[0])  # a call nested in another opens later
    root = type(model).__name__
    names: dict[int, str] = {}
    counts: dict[str, int] = {}
    nodes = []
    for node in lazy.topological([t.node for t in outputs], lambda n: n.srcs if n.op is not None else ()):
        name, kind = named.get(id(node), (None, node.op or "Constant"))
        if name is None:
            scope = next((s for first, last, s in innermost if first < node.seq < last), root)
            base = f"{scope}/{node.op or 'constant'}"
            counts[base] = counts.get(base, -1) + 1
            name = f"{base}_{counts[base]}"
        names[id(node)] = name
        attr = {"_output_shapes": _attr_shape(node.shape), "dtype": attr_value_pb2.AttrValue(s=str(node.dtype).encode())}
        if node.op is not None and node.arg is not None:
            attr["arg"] = attr_value_pb2.AttrValue(s=repr(node.arg)[:200].encode())
        sources = node.srcs if node.op is not None else ()
        nodes.append(node_def_pb2.NodeDef(name=name, op=kind, input=[names[id(s)] for s in sources], attr=attr))
    return graph_pb2.GraphDef(node=nodes, versions=versions_pb2.VersionDef(producer=22))
