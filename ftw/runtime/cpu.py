"""CpuMoeExecutor: the routed experts of any layer of an ExpertBanks, computed on the CPU in the
layer's own format (ftw._runtime's C++ kernels, csrc/formats/<name>/cpu.cpp).

    ex = CpuMoeExecutor(ftw.load_expert_banks("model.ftw"), threads=8)
    out = ex.forward(layer, hidden, topk_ids, topk_weights)     # [T, H], hidden's dtype

- hidden [T, H]: float32, or bf16 as a torch.bfloat16 tensor or a numpy uint16 array of bf16
  bit patterns (the loader's numpy convention for bf16 banks). The output has hidden's type
  and dtype (bf16 rounded to nearest even); products accumulate in float32.
- topk_ids [T, k]: int32 or int64 expert ids in [0, E); topk_weights [T, k]: float32.
- out[t] = sum_j w[t, j] * (down_e(act(gate_e x_t + gate_bias_e, up_e x_t + up_bias_e)) + down_bias_e)
  with the model's activation (ftw.formats.Activation).

One C++ format object per distinct (format, options); each layer points to one. Every layer is
checked when the executor is built: its format and ggml types must have CPU kernels and its
banks must match the format class (dtype, row shape), or the constructor raises naming the layer.
Banks are not copied: the executor keeps references to the arrays (numpy or torch) it reads.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from .. import _runtime, spec
from ..errors import FormatError, UnsupportedError
from ..formats import FORMATS, Activation, LayerFormat, get_format


def _dtype_str(a: Any) -> str:
    return str(a.dtype).removeprefix("torch.")


def _nbytes(a: Any) -> int:
    return a.nbytes if isinstance(a, np.ndarray) else a.numel() * a.element_size()


def _bank_dtype(a: Any, candidates: tuple[str, ...]) -> str | None:
    """Which of the format's dtypes for this bank the array holds (numpy views bf16 as uint16,
    e4m3 and e8m0 as uint8; torch has bfloat16 and float8_e4m3fn)."""
    got = _dtype_str(a)
    for name in candidates:
        d = spec.DTYPES[name]
        if got in (str(np.dtype(d.numpy)), d.torch):
            return name
    return None


def _option_text(options: Mapping[str, Any]) -> dict[str, str]:
    """Options as the C++ side takes them: text, lists comma-separated."""
    return {k: ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v) for k, v in options.items()}


class CpuMoeExecutor:
    def __init__(self, banks, threads: int | None = None, *, activation: Activation | None = None,
                 act_quant: bool = False):
        """banks: an ftw.ExpertBanks (numpy arrays or torch CPU tensors). threads: worker
        threads (default: every core). activation: overrides banks.model.activation (needed
        where the file has no model). act_quant: quantize ds_fp4 layers' projection inputs to
        e4m3 in act_block blocks first, as DeepSeek-V4's GPU path does (docs/ARCHITECTURE.md)."""
        model = banks.model
        act = activation or (model.activation if model is not None else None)
        if act is None:
            raise FormatError("CpuMoeExecutor: the banks carry no model, so no activation: pass activation=")
        if act.kind not in ("silu", "swiglu_oai"):
            raise UnsupportedError(f"CpuMoeExecutor: activation {act.kind!r} is not one the CPU executor computes")
        self.activation = act
        self.num_experts = banks.num_experts
        self._core = _runtime.CpuExecutor(int(threads or os.cpu_count() or 1))
        cpu_formats = set(_runtime.cpu_formats())
        self._format_index: dict[LayerFormat, int] = {}
        self.layer_formats: dict[int, LayerFormat] = {}
        self.dims: dict[int, tuple[int, int]] = {}  # layer -> (H, I)
        for layer in banks.layers:
            self._add_layer(banks, layer, cpu_formats, act_quant)

    def _add_layer(self, banks, layer: int, cpu_formats: set[str], act_quant: bool) -> None:
        lf = banks.layer_formats[layer]
        where = f"layer {layer} ({lf.name})"
        if lf.name not in FORMATS or lf.name not in cpu_formats:
            raise UnsupportedError(f"layer {layer}: format {lf.name!r} has no CPU kernel "
                                   f"(CPU formats: {', '.join(sorted(cpu_formats))})")
        cls = get_format(lf.name)
        options = dict(lf.options)
        arrays = {name: per_layer[layer] for name, per_layer in banks.banks.items()
                  if layer in per_layer and _nbytes(per_layer[layer])}
        shapes = {n: tuple(a.shape[1:]) for n, a in arrays.items()}
        model = banks.model
        if model is not None:
            H, I = model.hidden_size, model.intermediate_size(layer)  # noqa: E741
        else:
            H, I = cls.infer_dims(shapes, options)  # noqa: E741
        specs = cls.banks(H, I, options)
        typed = {}
        for name, a in arrays.items():
            s = specs.get(name)
            if s is None:
                raise FormatError(f"{where}: bank {name!r} is not a bank of {lf.name} (banks: {', '.join(specs)})")
            dt = _bank_dtype(a, s.dtypes + s.read_dtypes)
            if dt is None:
                raise FormatError(f"{where}: bank {name!r} holds {_dtype_str(a)}, {lf.name} stores it as "
                                  f"{'/'.join(s.dtypes + s.read_dtypes)}")
            typed[name] = (a, dt)
        try:
            # the kernel first: an unsupported ggml type is named before any bank is looked at
            if lf not in self._format_index:
                opts = _option_text(options)
                if act_quant and lf.name == "ds_fp4":
                    opts["act_quant"] = "e4m3"
                self._format_index[lf] = self._core.add_format(lf.name, opts)
            cls.check_banks({n: (typed[n][1], shapes[n]) for n in typed}, H, I, options, where, reading=True)
            act = self.activation
            self._core.add_layer(layer, self._format_index[lf], self.num_experts, H, I, typed, act.kind,
                                 float(act.limit or 0.0), float(act.alpha or 0.0))
        except (FormatError, UnsupportedError) as e:
            raise type(e)(f"{where}: {e}" if not str(e).startswith("layer ") else str(e)) from None
        self.layer_formats[layer] = lf
        self.dims[layer] = (H, I)

    @property
    def threads(self) -> int:
        return self._core.threads

    @property
    def num_formats(self) -> int:
        """Distinct (format, options) kernels built: layers sharing one share the object."""
        return len(self._format_index)

    def forward(self, layer: int, hidden, topk_ids, topk_weights):
        """[T, H] routed-expert output of `layer` (see the module docstring)."""
        if layer not in self.layer_formats:
            raise FormatError(f"the executor has no MoE layer {layer} (layers: {sorted(self.layer_formats)})")
        if isinstance(hidden, np.ndarray):
            out = np.empty(hidden.shape, dtype=hidden.dtype)
        elif type(hidden).__module__.startswith("torch"):
            import torch  # the caller already holds a tensor: torch is loaded

            out = torch.empty(tuple(hidden.shape), dtype=hidden.dtype)
        else:
            raise FormatError(f"layer {layer}: hidden must be a numpy array or a torch CPU tensor, got {type(hidden).__name__}")
        try:
            self._core.forward(layer, hidden, topk_ids, topk_weights, out)
        except TypeError:
            raise FormatError(f"layer {layer}: hidden, topk_ids and topk_weights must be numpy arrays or torch "
                              f"CPU tensors (got {type(hidden).__name__}, {type(topk_ids).__name__}, "
                              f"{type(topk_weights).__name__})") from None
        return out
