"""Devices: finding ggml's backends, naming them, starting one on first use, releasing it.

Names users see: ``cpu``, ``vulkan`` / ``vulkan:N``, ``cuda`` / ``cuda:N`` and ``gpu``
(the best real GPU: CUDA before Vulkan). A Vulkan device that is really the CPU
(Mesa's llvmpipe, "lavapipe") is usable by name but never counts as a GPU.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import warnings
from dataclasses import dataclass

from ggml import ggml as G

from . import launch, precision, streams

# ggml's own messages (the Vulkan backend's device banner, warnings) go to this logger,
# not to stderr: importing ggrad and starting a device print nothing; warnings and
# errors still show through logging's defaults; `python -m ggrad info` shows all.
log = logging.getLogger("ggrad.ggml")
_LEVELS = {G.GGML_LOG_LEVEL_DEBUG: logging.DEBUG, G.GGML_LOG_LEVEL_INFO: logging.INFO,
           G.GGML_LOG_LEVEL_WARN: logging.WARNING, G.GGML_LOG_LEVEL_ERROR: logging.ERROR}
_last_level = [logging.DEBUG]  # GGML_LOG_LEVEL_CONT continues the previous message's level


# ggml-vulkan says what each device can do only in its banner ("ggml_vulkan: 0 = NAME |
# uma: 0 | fp16: 1 | ... | matrix cores: KHR_coopmat"): kept per device index
_VULKAN_BANNER = re.compile(r"ggml_vulkan: (\d+) = .*?((?: \| [^|:]+: [^|]+)+)$")
_vulkan_traits: dict[int, dict[str, str]] = {}


@G.ggml_log_callback
def _to_logger(level: int, text: bytes, user_data) -> None:
    if level != G.GGML_LOG_LEVEL_CONT:
        _last_level[0] = _LEVELS.get(level, logging.INFO)
    message = text.decode("utf-8", "replace").rstrip("\n") if text else ""
    if message:
        banner = _VULKAN_BANNER.match(message)
        if banner:
            pairs = (field.split(":", 1) for field in banner.group(2).split(" | ") if field)
            _vulkan_traits[int(banner.group(1))] = {k.strip(): v.strip() for k, v in pairs}
        log.log(_last_level[0], message)


G.ggml_log_set(_to_logger, None)

# Vulkan drivers that run on the CPU: real Vulkan, but not a GPU.
_SOFTWARE_VULKAN = ("llvmpipe", "lavapipe", "swiftshader")

_BUILD_HINT = (
    "ggrad found no GPU backend in this ggml build. Build ggml-python with one: "
    "`make vulkan` (Vulkan) or `make cuda` (CUDA); see the README."
)


@dataclass(frozen=True)
class DeviceInfo:
    """One usable device, as `ggrad.devices()` reports it."""

    name: str
    kind: str
    description: str
    memory_total: int
    memory_free: int
    is_gpu: bool
    ggml_name: str


def _threads() -> int:
    env = os.environ.get("GGRAD_NUM_THREADS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


VULKAN_MAX_GRAPH_NODES = 32768


class Backend:
    """A started ggml backend of one device: the handle, its buffer type and traits."""

    def __init__(self, info: DeviceInfo, dev: int) -> None:
        self.info = info
        self.name = info.name
        self._dev = dev
        if info.kind == "vulkan":
            _set_vulkan_float16(info.name)
        handle = G.ggml_backend_dev_init(dev, None)
        if not handle:
            raise RuntimeError(f"ggml could not start device {info.name!r} ({info.description})")
        self.handle = handle
        if info.kind == "cpu":
            G.ggml_backend_cpu_set_n_threads(handle, _threads())
        if info.kind == "cuda":
            _check_cuda_precision()
        # NOTE: ggml_backend_vk_buffer_type and friends return pointers cut to 32 bits
        # in ggml-python 0.0.45; the device's buffer type is bound correctly.
        self.buft = G.ggml_backend_dev_buffer_type(dev)
        self.alignment = G.ggml_backend_buft_get_alignment(self.buft)
        self.max_buffer = G.ggml_backend_buft_get_max_size(self.buft)
        self.host_memory = bool(G.ggml_backend_buft_is_host(self.buft))
        # lavapipe crashed inside its driver running a graph of ~65,000 nodes (40,000 ran):
        # larger graphs are split (lazy.py)
        self.max_graph_nodes = VULKAN_MAX_GRAPH_NODES if info.kind == "vulkan" else None
        self.max_tensor_bytes = _largest_supported_tensor(handle) if info.kind == "vulkan" else None
        # graphs left running (streams.py) where the kind's ggml orders each after the last
        self.leaves_running = kernel_set() >= streams.LEFT_RUNNING_SINCE.get(info.kind, 0)

    def supports(self, node) -> bool:
        """Whether the backend runs `node` and can launch its kernel at its sizes."""
        return self.has_op(node) and self.launch_problem(node) is None

    def has_op(self, node) -> bool:
        """Whether the backend implements `node`'s op for its types (sizes aside)."""
        return bool(G.ggml_backend_supports_op(self.handle, node))

    def launch_problem(self, node) -> str | None:
        """Why `node` is too large for this device to start, or None."""
        found = launch.problem(self.info.kind, node)
        if found is None and self.max_tensor_bytes is not None:
            for tensor in (node, *(node.contents.src[i] for i in range(G.GGML_MAX_SRC))):
                if tensor and G.ggml_nbytes(tensor) > self.max_tensor_bytes:
                    return (f"a tensor of {G.ggml_nbytes(tensor):,} bytes passes this device's limit of "
                            f"{self.max_tensor_bytes:,} bytes per tensor (Vulkan's storage-buffer range)")
        return found

    def compute(self, graph) -> None:
        """Run `graph`; on CUDA and Vulkan it may still be running on return (streams.py)."""
        if streams.enabled and self.info.kind in streams.ASYNCHRONOUS_KINDS and self.leaves_running:
            streams.queue(self, graph)
            return
        status = G.ggml_backend_graph_compute(self.handle, graph)
        if status != 0:
            raise RuntimeError(f"ggml graph compute failed on {self.name} (status {status})")

    def free(self) -> None:
        if self.handle:
            streams.settle()
            G.ggml_backend_free(self.handle)
            self.handle = None


def _largest_supported_tensor(handle) -> int | None:
    """The most bytes one tensor may hold on a backend, as its supports-op decides (ggml-
    vulkan refuses any operand past the device's storage-buffer range, and says no more
    than no): a bisection over the size of a float32 copy. None where 2**40 bytes pass."""
    ctx = G.ggml_init(G.ggml_init_params(mem_size=4 * G.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
    try:
        def copy_passes(floats: int) -> bool:
            src = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, floats)
            ok = bool(G.ggml_backend_supports_op(handle, G.ggml_cont(ctx, G.ggml_view_1d(ctx, src, floats, 0))))
            G.ggml_reset(ctx)
            return ok
        low, high = 1, 1 << 38
        if copy_passes(high):
            return None
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if copy_passes(middle) else (low, middle)
        return 4 * low
    finally:
        G.ggml_free(ctx)


def _set_vulkan_float16(name: str) -> None:
    """Turn ggml-vulkan's float16 paths (its float16 shaders, its matrix cores) on or off
    for a device about to start."""
    allowed = precision.vulkan_float16_allowed()
    for switch, users in _USER_VK_FLOAT16.items():
        if users is None:
            if allowed:
                os.environ.pop(switch, None)
            else:
                os.environ[switch] = "1"
    precision.vulkan_started(name, any(switch not in os.environ for switch in _USER_VK_FLOAT16))


def cuda_honours_precision() -> bool:
    """Whether the loaded ggml-cuda runs GGML_PREC_F32 products in float32 (a build by
    `make cuda`; scripts/patch_ggml_cuda.py)."""
    return hasattr(ggml_library("libggml-cuda.so"), "ggml_backend_cuda_ggrad_f32_precision")


def ggml_library_path(name: str) -> str:
    """Where ggml-python keeps its library `name` (e.g. libggml-cuda.so)."""
    import ggml
    return os.path.join(os.path.dirname(ggml.__file__), "lib", name)


def ggml_library(name: str):
    try:
        return ctypes.CDLL(ggml_library_path(name))
    except OSError:
        return None


@functools.cache
def kernel_set() -> int:
    """The version of ggrad's kernel set in the loaded ggml (scripts/patch_ggml_kernels.py),
    0 without it."""
    marker = getattr(ggml_library("libggml-base.so"), "ggml_ggrad_kernels", None)
    return int(marker()) if marker is not None else 0


def adamw_exact() -> bool:
    """Whether ggml's AdamW kernel takes the 9-element form that computes PyTorch's exact
    update (scripts/patch_ggml_adamw.py, applied by ggrad's bootstrap)."""
    if _adamw_exact[0] is None:
        _adamw_exact[0] = hasattr(ggml_library("libggml-base.so"), "ggml_ggrad_adamw_exact")
    return _adamw_exact[0]


_adamw_exact: list[bool | None] = [None]


def _check_cuda_precision() -> None:
    if precision.get_float32_matmul_precision() == "highest" and not cuda_honours_precision():
        warnings.warn("this ggml-cuda build runs float32 matmuls in TF32 whatever the matmul precision; "
                      "build it with `make cuda` for float32 ('highest')", RuntimeWarning, stacklevel=2)


_registry: dict[str, tuple[DeviceInfo, int]] | None = None

# ggml-vulkan reads these when it creates a device; the user's own settings are left alone
# (ggml takes a switch that is set at all, even to 0, as on).
# ggml-vulkan's float16 paths follow the matmul precision (precision.py) unless the user set
# their switch: its f16 shaders round f32 matmul operands to f16 (~1e-3 relative error seen
# on batched products, inf past 65504), and so do its matrix-core (cooperative matrix)
# shaders, whatever GGML_VK_DISABLE_F16 says (on the H200, 123 of 831 Vulkan tests missed
# their float32 tolerances with them on, none with them off; issue 29).
_USER_VK_FLOAT16 = {switch: os.environ.get(switch)
                    for switch in ("GGML_VK_DISABLE_F16", "GGML_VK_DISABLE_COOPMAT", "GGML_VK_DISABLE_COOPMAT2")}
_VULKAN_DEFAULTS = {
    # Its graph optimizer reorders nodes by their sources, but cannot see that an in-place
    # store into a weight must wait for every read of the old weight (lazy.py).
    "GGML_VK_DISABLE_GRAPH_OPTIMIZE": "1",
    # Its integer-dot products (activations rounded to 8-bit Q8_1 blocks, for Q4_0-Q8_0
    # weights) gave NaN gradients on NVIDIA (H100, H200: a LoRA over Q4_0 or Q5_1 weights
    # after an earlier Q8_0 step in the same process; none in a fresh one: stale memory read);
    # without them a quantized product equals the dequantized weight's (6e-7 against 5e-3).
    # GGRAD_VK_INTEGER_DOT=1 keeps them (bench/gpu/lora_order.sh reproduces the NaN with it).
    "GGML_VK_DISABLE_INTEGER_DOT_PRODUCT": "1",
}
_KEPT_BY = {"GGML_VK_DISABLE_INTEGER_DOT_PRODUCT": "GGRAD_VK_INTEGER_DOT"}  # default -> the switch that drops it


def _discover() -> dict[str, tuple[DeviceInfo, int]]:
    """Enumerate ggml's devices once (starting Vulkan's instance is not free)."""
    global _registry
    if _registry is not None:
        return _registry
    for key, value in _VULKAN_DEFAULTS.items():
        if os.environ.get(_KEPT_BY.get(key, "")) != "1":
            os.environ.setdefault(key, value)
    found: dict[str, tuple[DeviceInfo, int]] = {}
    per_kind: dict[str, int] = {}
    for i in range(G.ggml_backend_dev_count()):
        dev = G.ggml_backend_dev_get(i)
        reg = G.ggml_backend_dev_backend_reg(dev)
        kind = G.ggml_backend_reg_name(reg).decode().lower()
        if kind not in ("cpu", "vulkan", "cuda"):
            continue
        description = G.ggml_backend_dev_description(dev).decode(errors="replace")
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        G.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        software = any(s in description.lower() for s in _SOFTWARE_VULKAN)
        dev_type = G.ggml_backend_dev_type(dev)
        is_gpu = kind != "cpu" and not software and dev_type in (
            G.GGML_BACKEND_DEVICE_TYPE_GPU, G.GGML_BACKEND_DEVICE_TYPE_IGPU)
        index = per_kind.get(kind, 0)
        per_kind[kind] = index + 1
        name = "cpu" if kind == "cpu" else f"{kind}:{index}"
        if kind == "cpu" and "cpu" in found:
            continue
        found[name] = (DeviceInfo(name, kind, description, total.value, free.value, is_gpu,
                                  G.ggml_backend_dev_name(dev).decode()), dev)
    _registry = found
    return found


def vulkan_traits(name: str) -> dict[str, str]:
    """What ggml-vulkan reported for a device ("vulkan:0") when it was found: fp16, bf16,
    warp size, shared memory, int dot, matrix cores ("none", "KHR_coopmat", "NV_coopmat2":
    what the device and the build's shaders can do; ggrad uses float16 paths only at
    "medium" matmul precision); {} where it said nothing."""
    _discover()
    return dict(_vulkan_traits.get(int(name.split(":")[1]), {})) if name.startswith("vulkan:") else {}


# A shader the Vulkan build carries for each optional feature (ggml-vulkan compiles each
# variant only where the glslc it was built with knows the extension)
SHADER_FEATURES = {"KHR_coopmat": "matmul_f32_f32_cm1_data", "NV_coopmat2": "matmul_f16_cm2_data",
                    "integer dot": "matmul_q4_0_q8_1_data", "bf16 coopmat": "matmul_bf16_cm1_data"}


def vulkan_shader_features() -> list[str] | None:
    """The optional shader families the Vulkan library was built with; None without one."""
    vulkan = ggml_library("libggml-vulkan.so")
    if vulkan is None:
        return None
    return [feature for feature, symbol in SHADER_FEATURES.items() if hasattr(vulkan, symbol)]


def devices() -> list[DeviceInfo]:
    """Every usable device: name, kind, description, memory, whether it is a real GPU."""
    order = {"cpu": 0, "cuda": 1, "vulkan": 2}
    return sorted((info for info, _ in _discover().values()), key=lambda i: (order[i.kind], i.name))


def gpu_available() -> bool:
    return any(info.is_gpu for info in devices())


def resolve(name: str) -> str:
    """The canonical device name for a user's name, or a clear error."""
    if not isinstance(name, str):
        raise TypeError(f"device name must be a str, got {type(name).__name__}")
    found = _discover()
    key = name.strip().lower()
    if key == "gpu":
        for kind in ("cuda", "vulkan"):
            for info, _ in found.values():
                if info.kind == kind and info.is_gpu:
                    return info.name
        raise RuntimeError(_BUILD_HINT if not any(i.kind != "cpu" for i, _ in found.values())
                           else "no GPU device: the only non-CPU devices here run on the CPU "
                                f"({', '.join(n for n in found if n != 'cpu')}); use them by name")
    if key in ("vulkan", "cuda"):
        key += ":0"
    if key in found:
        return key
    usable = ", ".join(sorted(found) + (["gpu"] if gpu_available() else []))
    raise ValueError(f"unknown device {name!r}; usable devices: {usable}")


def start(name: str) -> Backend:
    info, dev = _discover()[name]
    return Backend(info, dev)
