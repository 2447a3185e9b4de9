"""CUDA routed experts: one MoE layer's forward straight from the rows of a slot pool.

The kernels (csrc/cuda/, csrc/formats/<name>/cuda.cu) read each layer's banks as the FTW file
stores them, in the layer's own format, and compute for every (token, k) pair of a step

    out[t] = sum_k topk_weights[t, k] * (down_e @ act(gate_e @ x_t + gb_e, up_e @ x_t + ub_e) + db_e)

with e = topk_ids[t, k], whose rows are found through a device-side slot table
(``slot_of_expert[e]`` = the pool slot holding expert e, -1 when not resident). All routed
experts of a layer-step go through the same launches, with no host synchronisation when
``check=False``, so a decode step can be captured in a CUDA graph.

Numerics: x is rounded to bf16; weights are decoded exactly to bf16 (nvfp4's float32 global
multiplies each row's sum, fp8_block's float32 block scale each 64-value chunk's partial sum);
products accumulate in float32 on the tensor cores; the activation between gate_up and down is
rounded to bf16; out is float32. Measured error against float64: 0.85e-3 to 1.7e-3 relative.
gguf is the exception: ggml's float32 values (decoded bit-exactly per 32-value sub-block) are
rounded to bf16, <= 2^-9 relative per weight; measured 0.2e-3 to 6e-3 (tests/test_cuda_kernels_gguf.py).

Launches per layer-step: decode (T <= 8, T * top_k <= 128) two kernels, each block finding its
expert from topk_ids itself; prefill a routing kernel (pairs grouped by expert into tiles of
64), a clear of out, and the same two phases.

This module imports torch (tensors are the GPU buffers); ``ftw.runtime`` itself does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from .. import _runtime
from ..errors import FormatError, UnsupportedError
from ..formats import Activation, LayerFormat, get_format

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "f32", torch.float16: "f16"}


def cuda_formats() -> list[str]:
    """Layer formats with a CUDA kernel in this build (empty without CUDA)."""
    return list(_runtime.cuda_experts_formats())


def cuda_ggml_types() -> list[str]:
    """ggml types the gguf format decodes on the GPU in this build (empty without CUDA)."""
    return list(_runtime.cuda_ggml_types())


def ggml_type_ids(fmt: LayerFormat) -> list[int]:
    """The (gate, up, down) ggml type ids a gguf layer's kernel reads; [] for other formats."""
    if fmt.name != "gguf":
        return []
    from ..formats.ggml_types import ggml_type_named
    from ..formats.gguf import Gguf

    return [ggml_type_named(t, f"layer format {fmt.key()}").id for t in Gguf.types(fmt.options)]


def unsupported_reason(fmt: LayerFormat) -> str | None:
    """Why a layer of this format cannot run on the GPU in this build, or None when it can:
    the format has no CUDA kernel, or (gguf) a projection's ggml type has no CUDA decoder."""
    if fmt.name not in cuda_formats():
        return f"no CUDA kernel for {fmt.key()}"
    if fmt.name == "gguf":
        from ..formats.gguf import Gguf

        have = set(cuda_ggml_types())
        missing = [f"{proj} {t}" for proj, t in zip(("gate", "up", "down"), Gguf.types(fmt.options)) if t not in have]
        if missing:
            return f"no CUDA decoder for ggml type {', '.join(missing)} (CUDA types: {', '.join(cuda_ggml_types())})"
    return None


def available() -> bool:
    """True when this build has the CUDA kernels and torch sees a GPU."""
    return bool(cuda_formats()) and torch.cuda.is_available()


@dataclass
class LayerView:
    """One layer's rows on the GPU, the Python twin of csrc/pools/pool_view.h's PoolLayerView.

    banks: bank name -> CUDA tensor [S, *row] (S slots; row s of every bank is slot s), for
    the format's banks; a missing name or an [S, 0] tensor means the layer lacks that bank.
    slot_of_expert: int32 CUDA tensor [E]; entry e is expert e's slot, -1 if not resident.
    """

    format: LayerFormat
    banks: Mapping[str, torch.Tensor]
    slot_of_expert: torch.Tensor

    @property
    def num_slots(self) -> int:
        return int(self.banks["gate_up"].shape[0])

    @property
    def num_experts(self) -> int:
        return int(self.slot_of_expert.shape[0])


def identity_view(fmt: LayerFormat | str, banks: Mapping[str, Any], device: str | torch.device = "cuda") -> LayerView:
    """A view whose slot s holds expert s: the banks of one layer, [E, *row] each, on the GPU.

    Takes torch tensors or numpy arrays (copied to `device`); lets tests and the bench run the
    kernels without the pools."""
    fmt = fmt if isinstance(fmt, LayerFormat) else LayerFormat.of(fmt, {})
    gpu = {}
    for name, a in banks.items():
        t = a if isinstance(a, torch.Tensor) else _from_numpy(a)
        gpu[name] = t.to(device).contiguous()
    E = int(gpu["gate_up"].shape[0])
    return LayerView(fmt, gpu, torch.arange(E, dtype=torch.int32, device=device))


def _from_numpy(a) -> torch.Tensor:
    import numpy as np

    a = np.ascontiguousarray(a)
    if a.dtype == np.uint16:  # ftw's numpy views hold bf16 as its bit patterns
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


_workspaces: dict[tuple[int, int], torch.Tensor] = {}


def workspace(T: int, K: int, I: int, E: int, H: int, device: torch.device) -> torch.Tensor:  # noqa: E741
    """A cached device workspace big enough for (T, K, I, E) (grows, never shrinks), one per
    device: calls on one stream may share it; callers running layers on several streams at once,
    or capturing CUDA graphs, pass their own `ws` and keep it alive (sized by
    `cuda_experts_workspace_bytes(T, K, I, E, H)`)."""
    need = int(_runtime.cuda_experts_workspace_bytes(T, K, I, E, H))
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, 0)
    ws = _workspaces.get(key)
    if ws is None or ws.numel() < need:
        ws = torch.empty(need, dtype=torch.uint8, device=device)
        _workspaces[key] = ws
    return ws


def _activation(act: Activation | str | None) -> tuple[str, float, float]:
    if act is None:
        act = Activation("silu")
    elif isinstance(act, str):
        act = Activation(act) if act == "silu" else Activation.from_json(act, "activation")
    limit = float(act.limit) if act.limit is not None else math.inf
    alpha = float(act.alpha) if act.alpha is not None else 1.0
    return act.kind, alpha, limit


def _bank_args(view: LayerView, H: int, I: int) -> tuple[list[int], list[int], str, str]:  # noqa: E741
    """Bank pointers and slot strides in the format's bank order, plus the dtypes the kernel
    must know (expert biases, fp8_block scales). Absent banks pass (0, 0)."""
    fmt = get_format(view.format.name)
    S = view.num_slots
    bases, strides = [], []
    bias_dtype, scale_dtype = "bf16", "f32"
    for name in fmt.bank_names:
        t = view.banks.get(name)
        if t is None or t.numel() == 0:
            bases.append(0)
            strides.append(0)
            continue
        where = f"layer format {view.format.key()}: bank {name!r}"
        if not t.is_cuda or t.device != view.slot_of_expert.device:
            raise FormatError(f"{where} must be a CUDA tensor on {view.slot_of_expert.device}, got {t.device}")
        if t.shape[0] != S:
            raise FormatError(f"{where} has {t.shape[0]} slots, gate_up has {S}")
        if not t[0].is_contiguous() or (S > 1 and t.stride(0) * t.element_size() < t[0].numel() * t.element_size()):
            raise FormatError(f"{where}: each slot's row must be contiguous")
        bases.append(t.data_ptr())
        strides.append(t.stride(0) * t.element_size() if S > 1 else t[0].numel() * t.element_size())
        if name.endswith("_bias"):
            bias_dtype = _DTYPE_NAMES.get(t.dtype, str(t.dtype))
        if name.endswith("_scale") and view.format.name == "fp8_block":
            scale_dtype = _DTYPE_NAMES.get(t.dtype, str(t.dtype))
    return bases, strides, bias_dtype, scale_dtype


def _intermediate(view: LayerView) -> int:
    """I of a layer: gate_up is [S, 2I, ...], except gguf, whose down rows [S, H, row bytes] hold
    I values of the down type (gate_up may be one flat byte row per expert)."""
    if view.format.name == "gguf":
        from ..formats.ggml_types import ggml_type_named
        from ..formats.gguf import Gguf

        t = ggml_type_named(Gguf.types(view.format.options)[2])
        return int(view.banks["down"].shape[2]) // t.nbytes * t.block
    return int(view.banks["gate_up"].shape[1]) // 2


def check_routing(view: LayerView, topk_ids: torch.Tensor, where: str = "") -> None:
    """Host-side check (synchronises): every routed expert in range and resident in a slot."""
    E, S = view.num_experts, view.num_slots
    ids = topk_ids.to(torch.int64)
    bad = (ids < 0) | (ids >= E)
    if bool(bad.any()):
        t, k = (int(v) for v in bad.nonzero()[0])
        raise FormatError(f"{where}topk_ids[{t}, {k}] = {int(ids[t, k])} is not an expert of this layer (0..{E - 1})")
    if ids.shape[1] > 1:  # a token lists each expert once (the kernels group pairs by expert)
        srt = ids.sort(dim=1).values
        dup = (srt[:, 1:] == srt[:, :-1]).any(dim=1)
        if bool(dup.any()):
            t = int(dup.nonzero()[0])
            raise FormatError(f"{where}token {t} lists an expert twice in topk_ids: {ids[t].tolist()}")
    slots = view.slot_of_expert.to(torch.int64)[ids]
    bad = (slots < 0) | (slots >= S)
    if bool(bad.any()):
        t, k = (int(v) for v in bad.nonzero()[0])
        e = int(ids[t, k])
        raise FormatError(f"{where}expert {e} (topk_ids[{t}, {k}]) has slot {int(slots[t, k])}: "
                          f"not resident in this pool of {S} slots")


def experts_forward(
    view: LayerView,
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    activation: Activation | str | None = None,
    *,
    out: torch.Tensor | None = None,
    ws: torch.Tensor | None = None,
    check: bool = True,
    stream: torch.cuda.Stream | None = None,
) -> torch.Tensor:
    """One MoE layer's routed experts on the GPU: x [T, H] -> out [T, H] float32.

    topk_ids [T, K] (int32/int64) and topk_weights [T, K] (float) as the router gives them.
    check=True validates the routing on the host first (one synchronisation) and refuses a bad
    or non-resident expert with FormatError; check=False enqueues only (for CUDA graphs: pass
    `out` and `ws` that outlive the graph), and read_error(ws) reports a bad pair afterwards.
    """
    fmt = view.format
    where = f"cuda experts, layer format {fmt.key()}: "
    if fmt.name not in cuda_formats():
        raise UnsupportedError(f"{where}no CUDA kernel for {fmt.name!r} (CUDA formats: {', '.join(cuda_formats())})")
    reason = unsupported_reason(fmt)
    if reason is not None:
        raise UnsupportedError(where + reason)
    dev = view.slot_of_expert.device
    H = int(view.banks["down"].shape[1])
    I = _intermediate(view)  # noqa: E741
    if x.dim() != 2 or x.shape[1] != H:
        raise FormatError(f"{where}x must be [T, {H}], got {list(x.shape)}")
    T = int(x.shape[0])
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T or topk_weights.shape != topk_ids.shape:
        raise FormatError(f"{where}topk_ids and topk_weights must both be [T={T}, K], got "
                          f"{list(topk_ids.shape)} and {list(topk_weights.shape)}")
    K = int(topk_ids.shape[1])
    for name, t in (("x", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.device != dev:
            raise FormatError(f"{where}{name} is on {t.device}, the layer's slot table on {dev}")
    if view.slot_of_expert.dtype != torch.int32 or not view.slot_of_expert.is_contiguous():
        raise FormatError(f"{where}slot_of_expert must be a contiguous int32 tensor")
    if check:
        check_routing(view, topk_ids, where)
    xb = x.to(torch.bfloat16).contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    wts = topk_weights.to(torch.float32).contiguous()
    if out is None:
        out = torch.empty((T, H), dtype=torch.float32, device=dev)
    elif out.shape != (T, H) or out.dtype != torch.float32 or not out.is_contiguous() or out.device != dev:
        raise FormatError(f"{where}out must be a contiguous float32 [{T}, {H}] tensor on {dev}")
    need = int(_runtime.cuda_experts_workspace_bytes(T, K, I, view.num_experts, H))
    if ws is None:
        ws = workspace(T, K, I, view.num_experts, H, dev)
    elif ws.numel() * ws.element_size() < need:
        raise FormatError(f"{where}workspace of {ws.numel() * ws.element_size()} bytes, needs {need}")
    bases, strides, bias_dtype, scale_dtype = _bank_args(view, H, I)
    kind, alpha, limit = _activation(activation)
    bo, bi = fmt.options.get("block_size", [128, 128]) if fmt.name == "fp8_block" else (128, 128)
    s = stream if stream is not None else torch.cuda.current_stream(dev)
    _runtime.cuda_experts_forward(
        fmt.name, bases, strides, view.slot_of_expert.data_ptr(), view.num_experts, view.num_slots,
        H, I, T, K, xb.data_ptr(), ids.data_ptr(), wts.data_ptr(), out.data_ptr(), ws.data_ptr(),
        ws.numel() * ws.element_size(), kind, alpha, limit, int(bo), int(bi), scale_dtype, bias_dtype,
        s.cuda_stream, ggml_type_ids(fmt),
    )
    if check:
        err = read_error(ws)
        if err is not None:
            raise FormatError(f"{where}pair {err} (token {err // K}, k {err % K}) routed to a non-resident expert")
    return out


def read_error(ws: torch.Tensor) -> int | None:
    """After the stream ran: the first (t * K + k) pair the kernels skipped as not resident, or None."""
    v = int(ws[:4].view(torch.int32)[0])
    return None if v == 0 else v - 1


def stream_read(buf: torch.Tensor, sink: torch.Tensor, stream: torch.cuda.Stream | None = None) -> None:
    """The bench's ceiling: a read-only streaming kernel over buf's bytes (sink: >= 1024 int32)."""
    s = stream if stream is not None else torch.cuda.current_stream(buf.device)
    _runtime.cuda_stream_read(buf.data_ptr(), buf.numel() * buf.element_size(), sink.data_ptr(), s.cuda_stream)


__all__ = ["LayerView", "identity_view", "experts_forward", "check_routing", "read_error", "cuda_formats",
           "cuda_ggml_types", "ggml_type_ids", "unsupported_reason", "available", "workspace", "stream_read"]
