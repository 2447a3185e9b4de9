"""GGUF (llama.cpp) MoE checkpoints: per-layer ggml types, raw rows, split files.

Every routed-expert layer becomes format ``gguf`` with its own ggml types in the options, so
a Q4_K_M file (down Q6_K on some layers, Q4_K on others) or a dynamic quant (IQ2_XS gate/up,
IQ4_NL down) yields one format per distinct type pair. Nothing is requantized: a bank row is
the file's bytes. GGUF dims are reversed (ne[0] fastest), so an expert tensor in numpy order
is [E, rows, row_bytes] and expert e is one contiguous byte range: rows are zero-copy views
of the memory map, and a layer's bytes are only touched when its rows are fetched.

The metadata (tokenizer included) is kept as the attachment ``gguf_metadata.gguf``: a GGUF
with every key/value of the source, byte for byte, and no tensors. Chosen over JSON because
it is lossless by construction (value types, u8 vs i32 arrays, non-UTF-8 tokens all survive)
and llama.cpp's own tools and gguf.GGUFReader read it as it is. The ``split.*`` keys are left
out: they describe the source's shards, and a tool reading the attachment must not go
looking for them.
"""

from __future__ import annotations

import math
import os
import re
from typing import Iterable

import numpy as np

from ftw.banks import LayerBanks, RowPieces, SourceTensor
from ftw.errors import SourceError, UnsupportedError
from ftw.formats import Activation, LayerFormat, ModelShape
from ftw import spec
from ftw.layer_ranges import format_layers
from ftw.spec import decimal_index, numpy_dtype

from .base import CheckpointReader, register_opener
from .families.base import MAX_DIM, short
from .gguf_file import FLOAT_DTYPES, KV, GGUFFile, GgufTensor, tensorless_gguf

ARCHS = ("qwen3moe", "qwen35moe", "qwen3next", "gpt-oss", "deepseek2", "glm4moe", "glm-dsa",
         "deepseek4", "glm5-next")
METADATA_ATTACHMENT = "gguf_metadata.gguf"
# [0-9], not \d: \d also matches Arabic-Indic digits, which int() reads but no shard name has
SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf$", re.IGNORECASE)

# llama.cpp hard-codes gpt-oss's clamped SwiGLU (llm_build_openai_moe_iswa): no metadata key
GPT_OSS_ACTIVATION = Activation("swiglu_oai", alpha=1.702, limit=7.0)  # fixed in llama.cpp's gpt-oss graph
BIAS_DTYPES = {"F32": "f32", "F16": "f16"}


def _whole(v) -> int | None:
    """A GGUF integer value as an int; None for anything else (a string, a float, an array)."""
    if isinstance(v, (np.integer,)):
        return int(v)
    return v if type(v) is int else None


def _shard_paths(path: str) -> list[str]:
    m = SPLIT_RE.match(os.path.basename(path))
    if not m:
        return [path]
    count, no = int(m["count"]), int(m["no"])
    if not 1 <= no <= count:
        raise SourceError(f"{path}: the name says shard {no} of {count}: no such shard of a split GGUF")
    folder = os.path.dirname(path)
    paths = [os.path.join(folder, f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for p in paths:
        if not os.path.isfile(p):
            raise SourceError(f"{p}: shard {paths.index(p) + 1} of {count} of split GGUF {path} is missing")
    return paths


class _Layer:
    """One MoE layer's expert tensors, found and checked from tensor infos alone."""

    def __init__(self, layer: int, fmt: LayerFormat, parts: dict[str, list[GgufTensor]],
                 biases: dict[str, list[GgufTensor]], I: int):
        self.layer, self.format, self.parts, self.biases, self.I = layer, fmt, parts, biases, I

    def tensors(self) -> list[GgufTensor]:
        return [t for ts in (*self.parts.values(), *self.biases.values()) for t in ts]


class GgufReader(CheckpointReader):
    def __init__(self, path: str):
        self._files: list[GGUFFile] = []
        paths = _shard_paths(path)
        self.path = paths[0]  # any shard opens the whole model, named by its first file
        try:
            for i, p in enumerate(paths):
                self._files.append(GGUFFile(p, shard=i))
            self._check_shards()
            self._infos: dict[str, GgufTensor] = {}
            for f in self._files:
                for name, info in f.tensors.items():
                    if name in self._infos:
                        raise SourceError(f"{f.path}: tensor {name} is also in {self._files[self._infos[name].shard].path}")
                    self._infos[name] = info
            self.kv: dict[str, KV] = {}
            for f in self._files:  # the first shard holds the model's metadata: it wins
                for k, v in f.kv.items():
                    self.kv.setdefault(k, v)
            self.arch = self._str("general.architecture")
            self.model = self._read_shape()
            self._layers: dict[int, _Layer] = {}
            for layer in self.model.moe_layers:
                self._layers[layer] = self._resolve(layer)
            self._check_dense_blocks()
        except BaseException:
            self.close()
            raise

    # -- metadata -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"gguf/{self.arch}"

    def _check_shards(self) -> None:
        first = self._files[0]
        if len(self._files) == 1 and "split.count" not in first.kv:
            return
        count = first.kv.get("split.count")
        if count is None or _whole(count.value) != len(self._files):
            raise SourceError(
                f"{first.path}: split.count is {count and count.value}, but the file name says "
                f"{len(self._files)} shards"
            )
        for i, f in enumerate(self._files):
            no = f.kv.get("split.no")
            if no is None or _whole(no.value) != i:
                raise SourceError(f"{f.path}: split.no is {no and no.value}, expected {i}")
        total = first.kv.get("split.tensors.count")
        have = sum(len(f.tensors) for f in self._files)
        if total is not None and _whole(total.value) != have:
            raise SourceError(f"{first.path}: split.tensors.count says {total.value} tensors, the shards hold {have}")

    def _get(self, key: str, required: bool = True):
        kv = self.kv.get(key)
        if kv is None:
            if required:
                raise SourceError(f"{self.path}: metadata key {key} is missing")
            return None
        return kv.value

    def _str(self, key: str) -> str:
        v = self._get(key)
        if not isinstance(v, str):
            raise SourceError(f"{self.path}: metadata key {key} must be a string, got {v!r:.60}")
        return v

    def _int(self, key: str, default: int | None = None, lo: int = 0, hi: int = MAX_DIM) -> int:
        v = self._get(key, required=default is None)
        if v is None:
            return default  # type: ignore[return-value]
        n = _whole(v)
        if n is None or not lo <= n <= hi:
            raise SourceError(f"{self.path}: metadata key {key} must be an integer in [{lo}, {hi}], got {short(v)}")
        return n

    def _read_shape(self) -> ModelShape:
        a = self.arch
        if f"{a}.expert_count" not in self.kv:
            raise UnsupportedError(
                f"{self.path}: architecture {a!r} has no {a}.expert_count: not a MoE model "
                f"(supported: {', '.join(ARCHS)})"
            )
        H = self._int(f"{a}.embedding_length", lo=1)
        E = self._int(f"{a}.expert_count", lo=1, hi=spec.MAX_EXPERTS)
        top_k = self._int(f"{a}.expert_used_count", hi=E)
        # bounded before anything is sized by them (2**62 blocks would be a MemoryError)
        n_layers = self._int(f"{a}.block_count", hi=spec.MAX_LAYERS)
        lead = self._int(f"{a}.leading_dense_block_count", 0, hi=n_layers)
        nextn = self._int(f"{a}.nextn_predict_layers", 0, hi=n_layers)
        self._check_block_numbers(n_layers)
        widths = self._widths(n_layers)
        # llama.cpp counts the MTP (nextn) blocks in block_count and puts them last; like the
        # safetensors readers, they are not decoder layers, so their tensors are carried as is
        decoder_layers = n_layers - nextn
        moe_layers = [i for i in range(lead, decoder_layers) if widths[i] > 0]
        extra: dict = {"gguf_arch": a, "leading_dense_block_count": lead}
        if nextn:
            extra["nextn_layers"] = list(range(decoder_layers, n_layers))
        first_width = widths[moe_layers[0]] if moe_layers else 0
        for key in ("expert_shared_count", "expert_weights_scale", "expert_weights_norm", "expert_gating_func"):
            v = self._get(f"{a}.{key}", required=False)
            if v is not None and not isinstance(v, (list, np.ndarray)):
                if isinstance(v, float) and not math.isfinite(v):  # NaN is no JSON value: the index could not hold it
                    raise SourceError(f"{self.path}: metadata key {a}.{key} is {v}, expected a finite number")
                extra[key] = v.item() if hasattr(v, "item") else v
        activation = GPT_OSS_ACTIVATION if a == "gpt-oss" else Activation("silu")
        if a not in ARCHS:
            extra["unlisted_arch"] = True  # same tensor names, but not one of the tested archs
        return ModelShape(
            family=a, hidden_size=H, moe_intermediate_size=first_width,
            num_experts=E, top_k=top_k, num_layers=n_layers, moe_layers=moe_layers,
            activation=activation, extra=extra,
            layer_intermediate_sizes={i: widths[i] for i in moe_layers if widths[i] != first_width},
        )

    def _widths(self, n_layers: int) -> list[int]:
        """I per layer: expert_feed_forward_length, a scalar or one entry per block."""
        key = f"{self.arch}.expert_feed_forward_length"
        v = self._get(key, required=False)
        if v is None:
            # older conversions omit it: the first expert tensor's rows tell
            for name, info in self._infos.items():
                if name.endswith((".ffn_gate_exps.weight", ".ffn_up_exps.weight")):
                    return [info.ne[1]] * n_layers
                if name.endswith(".ffn_gate_up_exps.weight"):
                    return [info.ne[1] // 2] * n_layers
            raise SourceError(f"{self.path}: metadata key {key} is missing and no expert tensor gives it")
        if isinstance(v, (list, np.ndarray)):
            if len(v) != n_layers:
                raise SourceError(f"{self.path}: {key} has {len(v)} entries, expected block_count = {n_layers}")
            widths = [_whole(x) for x in v]  # 0: a dense block
            if not all(w is not None and 0 <= w <= MAX_DIM for w in widths):
                raise SourceError(f"{self.path}: {key} must hold integers in [0, {MAX_DIM}], got {short(v)}")
            return widths
        w = _whole(v)
        if w is None or not 1 <= w <= MAX_DIM:
            raise SourceError(f"{self.path}: {key} must be an integer in [1, {MAX_DIM}], got {short(v)}")
        return [w] * n_layers

    def _check_dense_blocks(self) -> None:
        """A decoder block the metadata makes dense (leading_dense_block_count, a width of 0)
        must not hold routed experts: they would be carried as plain tensors, the model
        silently converted with a layer fewer."""
        moe = set(self.model.moe_layers)
        decoder = self.model.num_layers - len(self.model.extra.get("nextn_layers", []))
        for name in self._infos:
            if name.startswith("blk.") and "_exps." in name:
                n = decimal_index(name[4:].split(".", 1)[0])
                if n is not None and n < decoder and n not in moe:
                    raise SourceError(
                        f"{self.path}: tensor {name} holds routed experts, but the {self.arch}.* metadata "
                        f"makes block {n} dense (MoE blocks: {format_layers(self.model.moe_layers) or 'none'})"
                    )

    def _check_block_numbers(self, n_layers: int) -> None:
        """Every `blk.N.` tensor names a block below block_count, in canonical decimal: a
        tensor of an undeclared block would otherwise be carried as if it were the model's."""
        bad: dict[int | str, str] = {}
        for name in self._infos:
            if name.startswith("blk."):
                n = decimal_index(name[4:].split(".", 1)[0])
                if n is None or n >= n_layers:
                    bad.setdefault(n if n is not None else "?", name)
        if bad:
            some = next(iter(bad.values()))
            raise SourceError(
                f"{self.path}: tensor {short(some)} names a block that is not one of block_count = "
                f"{n_layers} (blocks are 0-{n_layers - 1}, in plain decimal); {len(bad)} such block(s)"
            )

    # -- layers ---------------------------------------------------------------------------
    def _need(self, name: str, layer: int) -> GgufTensor:
        info = self._infos.get(name)
        if info is None:
            raise SourceError(f"{self.path}: layer {layer}: expert tensor {name} is missing")
        return info

    def _check(self, info: GgufTensor, want: tuple[int, ...], what: str) -> None:
        if info.ne != want:
            raise SourceError(
                f"{self.path}: tensor {info.name}: ggml shape {list(info.ne)}, expected {what} = "
                f"{list(want)} from the {self.arch}.* metadata"
            )

    def _resolve(self, layer: int) -> _Layer:
        m = self.model
        H, E = m.hidden_size, m.num_experts
        I = m.intermediate_size(layer)
        p = f"blk.{layer}."
        fused = self._infos.get(p + "ffn_gate_up_exps.weight")
        if fused is not None:
            self._check(fused, (H, 2 * I, E), "[H, 2I, E]")
            parts = {"gate_up": [fused]}
            opts = {"gate_up_type": fused.type.name}
        else:
            gate = self._need(p + "ffn_gate_exps.weight", layer)
            up = self._need(p + "ffn_up_exps.weight", layer)
            self._need(p + "ffn_down_exps.weight", layer)
            self._check(gate, (H, I, E), "[H, I, E]")
            self._check(up, (H, I, E), "[H, I, E]")
            parts = {"gate_up": [gate, up]}
            if gate.type == up.type:
                opts = {"gate_up_type": gate.type.name}
            else:
                opts = {"gate_type": gate.type.name, "up_type": up.type.name}
        down = self._need(p + "ffn_down_exps.weight", layer)
        self._check(down, (I, H, E), "[I, H, E]")
        parts["down"] = [down]
        opts["down_type"] = down.type.name
        return _Layer(layer, LayerFormat.of("gguf", opts), parts, self._biases(layer, I, fused is not None), I)

    def _biases(self, layer: int, I: int, fused: bool) -> dict[str, list[GgufTensor]]:
        """gpt-oss expert biases: f32 [E, I] per gate/up, [E, H] for down."""
        H, E = self.model.hidden_size, self.model.num_experts
        p = f"blk.{layer}."
        # a fused gate_up weight may still come with separate gate and up biases
        if fused and p + "ffn_gate_up_exps.bias" in self._infos:
            names, want = [p + "ffn_gate_up_exps.bias"], [(2 * I, E)]
        else:
            names, want = [p + "ffn_gate_exps.bias", p + "ffn_up_exps.bias"], [(I, E), (I, E)]
        out = {}
        found = [n for n in names if n in self._infos]
        if found:
            gu = [self._need(n, layer) for n in names]  # one of gate/up without the other: named
            for info, w in zip(gu, want):
                self._check_bias(info, w)
            if len({t.type.name for t in gu}) > 1:
                raise UnsupportedError(f"{self.path}: layer {layer}: gate and up biases of different types")
            out["gate_up_bias"] = gu
        down = self._infos.get(p + "ffn_down_exps.bias")
        if down is not None:
            self._check_bias(down, (H, E))
            out["down_bias"] = [down]
        return out

    def _check_bias(self, info: GgufTensor, want: tuple[int, ...]) -> None:
        if info.type.name not in BIAS_DTYPES:
            raise UnsupportedError(f"{self.path}: tensor {info.name}: expert bias of type {info.type.name} (F32/F16 expected)")
        self._check(info, want, "[out, E]")

    def layer_formats(self) -> dict[int, LayerFormat]:
        return {i: lay.format for i, lay in self._layers.items()}

    def plan(self, layers: Iterable[int] | None = None) -> list[LayerBanks]:
        return [self._banks(self._layers[i]) for i in self.wanted_layers(layers)]

    def _view(self, info: GgufTensor) -> np.ndarray:
        """The one place tensor bytes are mapped (tests count the ranges handed out here)."""
        return self._files[info.shard].view(info)

    def _banks(self, lay: _Layer) -> LayerBanks:
        """Dtypes and row shapes come from the gguf format (gate_up is [2I, row bytes] when gate
        and up share a type, one flat byte row when they do not); here only where rows live."""
        parts = {"gate_up": lay.parts["gate_up"], "down": lay.parts["down"], **lay.biases}
        rows = {name: self._rows(p) for name, p in parts.items()}
        dtypes = {name: BIAS_DTYPES[b[0].type.name] for name, b in lay.biases.items()}
        m = self.model
        lb = LayerBanks.build(lay.layer, lay.format, m.hidden_size, lay.I, m.num_experts, rows, dtypes)
        lb.reference = self._reference(lay)
        return lb

    def _reference(self, lay: _Layer):
        """Expert e's gate, up and down as the GGUF stores them ({"weight": raw ggml rows,
        "type": its ggml type}), taken per tensor with no bank assembly: ftw check's
        independent reference (readers/families/reference.py explains why)."""
        I, gu, down = lay.I, lay.parts["gate_up"], lay.parts["down"][0]

        def rows(info: GgufTensor, e: int, lo: int = 0, hi: int | None = None) -> dict:
            return {"weight": self._view(info)[e][lo:hi], "type": info.type.name}

        def floats(info: GgufTensor, e: int) -> np.ndarray:
            return self._view(info)[e].reshape(-1).view(numpy_dtype(BIAS_DTYPES[info.type.name]))

        def ref(e: int) -> dict:
            if len(gu) == 1:  # fused ffn_gate_up_exps: gate rows, then up rows
                out = {"gate": rows(gu[0], e, 0, I), "up": rows(gu[0], e, I)}
            else:
                out = {"gate": rows(gu[0], e), "up": rows(gu[1], e)}
            out["down"] = rows(down, e)
            b = lay.biases.get("gate_up_bias", [])
            if len(b) == 1:
                v = floats(b[0], e)
                out["gate_bias"], out["up_bias"] = v[:I], v[I:]
            elif len(b) == 2:
                out["gate_bias"], out["up_bias"] = floats(b[0], e), floats(b[1], e)
            if "down_bias" in lay.biases:
                out["down_bias"] = floats(lay.biases["down_bias"][0], e)
            return out

        return ref

    def _rows(self, parts: list[GgufTensor]) -> RowPieces:
        # a view of the map reads nothing, and the writer never reads one: it copies the
        # bytes behind it with pread (ftw/mapped.py)
        views = [self._view(t) for t in parts]

        def row(e: int) -> list[np.ndarray]:
            return [v[e] for v in views]

        return row

    # -- everything else ------------------------------------------------------------------
    def tensors(self) -> list[SourceTensor]:
        taken = {t.name for lay in self._layers.values() for t in lay.tensors()}
        return [self._source_tensor(info) for name, info in self._infos.items() if name not in taken]

    def _source_tensor(self, info: GgufTensor) -> SourceTensor:
        """Float and integer types keep their values' dtype and numpy shape (ne reversed); a
        quantized tensor is u8 [..., rows, row_bytes] (its numpy shape with the row as bytes,
        so [rows, row_bytes] for the usual 2-D weight), with ggml_type/ggml_shape in meta."""
        t = info.type
        meta = {"ggml_type": t.name, "ggml_type_id": t.id, "ggml_shape": list(info.ne)}
        if t.quantized:
            return SourceTensor(info.name, "u8", info.byte_shape, lambda: self._view(info), meta)
        dtype = FLOAT_DTYPES[t.name]
        shape = tuple(reversed(info.ne))
        return SourceTensor(
            info.name, dtype, shape, lambda: self._view(info).view(numpy_dtype(dtype)).reshape(shape), meta
        )

    def attachments(self) -> dict[str, bytes]:
        keys = [k for k in self.kv if not k.startswith("split.")]
        return {METADATA_ATTACHMENT: tensorless_gguf(self._files, keys)}

    def source_files(self) -> list[str]:
        return [f.path for f in self._files]

    def release_pages(self) -> None:
        for f in self._files:
            f.release_pages()

    def close(self) -> None:
        for f in self._files:
            f.close()


@register_opener
def open_gguf(path: str) -> GgufReader | None:
    if not (os.path.isfile(path) and path.lower().endswith(".gguf")):
        return None
    return GgufReader(path)
