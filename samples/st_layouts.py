"""Numeric codecs, raw safetensors I/O and tensor naming for the sample checkpoints.

Everything here is written from LAYOUTS.md alone and deliberately does not import ftw or
readers: the samples and their references must stay an independent check of those packages.
Quantizers pick scales from block absmax and round to the nearest code, so the dequantized
weights stay close to the floats they came from (the tests bound the error).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch

# --------------------------------------------------------------------------- codes

E2M1_MAG = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
E2M1 = np.concatenate([E2M1_MAG, -E2M1_MAG])  # index = nibble; bit 3 is the sign

# decoded through torch's own float8 type so the table is not a copy of anyone's formula
E4M3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double().numpy()
E4M3_MAX = 448.0


def e8m0(byte: np.ndarray) -> np.ndarray:
    b = np.asarray(byte).astype(np.float64)
    return np.where(b == 255, np.nan, np.exp2(b - 127))


def bf16_to_f64(u16: np.ndarray) -> np.ndarray:
    return (np.asarray(u16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def to_bf16(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """Nearest e4m3fn byte (torch rounds to nearest even); saturates at +-448, never NaN."""
    x = np.clip(np.asarray(x, dtype=np.float32), -E4M3_MAX, E4M3_MAX)
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def fp4_codes(x: np.ndarray) -> np.ndarray:
    """Nearest E2M1 nibble of already-scaled values; |x| > 6 saturates to 6."""
    x = np.asarray(x, dtype=np.float64)
    idx = np.abs(np.abs(x)[..., None] - E2M1_MAG).argmin(-1).astype(np.uint8)
    neg = np.signbit(x) & (idx > 0)  # keep zero positive: no -0 codes
    return idx | (neg.astype(np.uint8) << 3)


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """Two values per byte along the last (input) axis; the low nibble holds the even element."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    b = np.asarray(packed).view(np.uint8)
    out = np.empty(b.shape[:-1] + (2 * b.shape[-1],), dtype=np.float64)
    out[..., 0::2] = E2M1[b & 0xF]
    out[..., 1::2] = E2M1[b >> 4]
    return out


# --------------------------------------------------------------------------- quantizers
# each takes one float64 weight [out, in] and returns numpy arrays in storage form


def quant_fp8_block(w: np.ndarray, block: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-V3 block FP8: (e4m3 bytes [out, in], float32 scale_inv [ceil(out/b), ceil(in/b)])."""
    out, inn = w.shape
    ro, ri = -(-out // block), -(-inn // block)
    scale = np.zeros((ro, ri), dtype=np.float32)
    for i in range(ro):
        for j in range(ri):
            amax = np.abs(w[i * block:(i + 1) * block, j * block:(j + 1) * block]).max()
            scale[i, j] = amax / E4M3_MAX if amax > 0 else 1.0
    full = np.repeat(np.repeat(scale.astype(np.float64), block, 0), block, 1)[:out, :inn]
    return e4m3_encode(w / full), scale


def quant_nvfp4_modelopt(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """ModelOpt NVFP4: (u8 packed [out, in/2], e4m3 bytes [out, in/16], float32 weight_scale_2)."""
    out, inn = w.shape
    amax = np.abs(w).max()
    ws2 = np.float32(amax / (6.0 * E4M3_MAX)) if amax > 0 else np.float32(1.0)
    blocks = w.reshape(out, inn // 16, 16)
    scale = e4m3_encode(np.abs(blocks).max(-1) / 6.0 / float(ws2))
    eff = E4M3[scale] * float(ws2)
    safe = np.where(eff > 0, eff, 1.0)[..., None]
    codes = fp4_codes(np.where(eff[..., None] > 0, blocks / safe, 0.0)).reshape(out, inn)
    return pack_fp4(codes), scale, ws2


def quant_e8m0_fp4(w: np.ndarray, group: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 / DeepSeek-V4 FP4: (u8 packed [out, in/2], E8M0 bytes [out, in/group])."""
    out, inn = w.shape
    blocks = w.reshape(out, inn // group, group)
    amax = np.abs(blocks).max(-1)
    # smallest power of two that brings the block max to <= 6 (the largest E2M1 value)
    exp = np.where(amax > 0, np.ceil(np.log2(np.where(amax > 0, amax, 1.0) / 6.0)), 0.0)
    byte = np.clip(exp + 127, 0, 254).astype(np.uint8)
    codes = fp4_codes(blocks / e8m0(byte)[..., None]).reshape(out, inn)
    return pack_fp4(codes), byte


# --------------------------------------------------------------------------- raw safetensors

ST_DTYPES = {
    "BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
    "F8_E4M3": np.uint8, "F8_E8M0": np.uint8, "U8": np.uint8, "I8": np.int8,
    "I16": np.int16, "I32": np.int32, "I64": np.int64, "U16": np.uint16, "U32": np.uint32,
    "BOOL": np.bool_,
}


def read_header(path: str | Path) -> dict:
    """The JSON header of one .safetensors file, without its __metadata__."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


def shard_files(sample_dir: str | Path) -> list[Path]:
    d = Path(sample_dir)
    idx = d / "model.safetensors.index.json"
    if idx.exists():
        return [d / f for f in sorted(set(json.loads(idx.read_text())["weight_map"].values()))]
    return sorted(d.glob("*.safetensors"))


def tensor_headers(sample_dir: str | Path) -> dict[str, dict]:
    """name -> {dtype, shape, file} over every shard of a checkpoint folder."""
    out = {}
    for f in shard_files(sample_dir):
        for k, v in read_header(f).items():
            out[k] = dict(v, file=f.name)
    return out


class RawTensors:
    """Read tensors as numpy arrays of their storage bits (bf16 as uint16, float8 as uint8)."""

    def __init__(self, sample_dir: str | Path):
        self.headers = {}
        self._maps = {}
        for f in shard_files(sample_dir):
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
            self._maps[f.name] = (np.memmap(f, dtype=np.uint8, mode="r"), 8 + n)
            for k, v in read_header(f).items():
                self.headers[k] = dict(v, file=f.name)

    def __contains__(self, name: str) -> bool:
        return name in self.headers

    def keys(self):
        return self.headers.keys()

    def dtype(self, name: str) -> str:
        return self.headers[name]["dtype"]

    def get(self, name: str) -> np.ndarray:
        h = self.headers[name]
        buf, base = self._maps[h["file"]]
        a, b = h["data_offsets"]
        return np.frombuffer(buf[base + a: base + b].tobytes(), dtype=ST_DTYPES[h["dtype"]]).reshape(h["shape"])

    def float(self, name: str) -> np.ndarray:
        """Plain float64 value of an unquantized tensor (bf16/f16/f32)."""
        a = self.get(name)
        return bf16_to_f64(a) if self.dtype(name) == "BF16" else a.astype(np.float64)


# --------------------------------------------------------------------------- naming
# What the expert tensors of a manifest entry are called and what they hold; the tests
# check every committed file against this, the readers' tests can use it as a map.

PROJ = ("gate", "up", "down")


def expert_prefix(entry: dict, layer: int) -> str:
    return f"{entry['naming']['layers']}{layer}.{entry['naming']['experts']}"


def expected_expert_tensors(entry: dict) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype, shape) of every routed-expert tensor in the MoE layers."""
    E, H, I = entry["E"], entry["H"], entry["I"]
    nm = entry["naming"]
    out: dict[str, tuple[str, list[int]]] = {}
    for layer_s, fmt in entry["formats"].items():
        pre = expert_prefix(entry, int(layer_s))
        if entry["layout"] == "stacked":
            if fmt == "bf16" and entry["family"] == "gpt_oss":
                out[f"{pre}.gate_up_proj"] = ("BF16", [E, H, 2 * I])
                out[f"{pre}.gate_up_proj_bias"] = ("BF16", [E, 2 * I])
                out[f"{pre}.down_proj"] = ("BF16", [E, I, H])
                out[f"{pre}.down_proj_bias"] = ("BF16", [E, H])
            elif fmt == "bf16":
                out[f"{pre}.gate_up_proj"] = ("BF16", [E, 2 * I, H])
                out[f"{pre}.down_proj"] = ("BF16", [E, H, I])
            elif fmt == "affine":  # MLX switch_mlp; bits and group size per layer in entry["options"]
                bits, gs = (entry["options"][layer_s][k] for k in ("bits", "group_size"))
                for p, name in zip(PROJ, nm["proj"]):
                    o, i = (I, H) if p != "down" else (H, I)
                    out[f"{pre}.{name}.weight"] = ("U32", [E, o, i * bits // 32])
                    out[f"{pre}.{name}.scales"] = ("BF16", [E, o, i // gs])
                    out[f"{pre}.{name}.biases"] = ("BF16", [E, o, i // gs])
            elif fmt == "mxfp8":  # MLX switch_mlp mode mxfp8: four e4m3 bytes per u32, E8M0 per 32, no biases
                for p, name in zip(PROJ, nm["proj"]):
                    o, i = (I, H) if p != "down" else (H, I)
                    out[f"{pre}.{name}.weight"] = ("U32", [E, o, i // 4])
                    out[f"{pre}.{name}.scales"] = ("U8", [E, o, i // 32])
            elif fmt == "mxfp4":
                for p, o, i in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
                    out[f"{pre}.{p}_blocks"] = ("U8", [E, o, i // 32, 16])
                    out[f"{pre}.{p}_scales"] = ("U8", [E, o, i // 32])
                    out[f"{pre}.{p}_bias"] = ("BF16", [E, o])
            else:
                raise ValueError(f"no stacked layout for {fmt}")
            continue
        for e in range(E):
            for p, name in zip(PROJ, nm["proj"]):
                o, i = (I, H) if p != "down" else (H, I)
                base = f"{pre}.{e}.{name}"
                out.update({base + k: v for k, v in per_expert_tensors(fmt, entry, o, i).items()})
    return out


def per_expert_tensors(fmt: str, entry: dict, o: int, i: int) -> dict[str, tuple[str, list[int]]]:
    b = 128
    if fmt == "bf16":
        return {".weight": ("BF16", [o, i])}
    if fmt == "fp8_block":
        scale = ".scale" if entry["naming"].get("scale_suffix") == ".scale" else ".weight_scale_inv"
        return {".weight": ("F8_E4M3", [o, i]), scale: ("F32", [-(-o // b), -(-i // b)])}
    if fmt == "nvfp4":
        if entry["naming"].get("nvfp4") == "compressed-tensors":
            return {
                ".weight_packed": ("U8", [o, i // 2]),
                ".weight_scale": ("F8_E4M3", [o, i // 16]),
                ".weight_global_scale": ("F32", [1]),
                ".input_global_scale": ("F32", [1]),
            }
        return {
            ".weight": ("U8", [o, i // 2]),
            ".weight_scale": ("F8_E4M3", [o, i // 16]),
            ".weight_scale_2": ("F32", []),
            ".input_scale": ("F32", []),
        }
    if fmt == "ds_fp4":
        return {".weight": ("I8", [o, i // 2]), ".scale": ("F8_E8M0", [o, i // 32])}
    if fmt == "mxfp8":  # compressed-tensors mxfp8-quantized: E8M0 bytes stored as U8
        return {".weight": ("F8_E4M3", [o, i]), ".weight_scale": ("U8", [o, i // 32])}
    raise ValueError(f"unknown per-expert format {fmt}")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)

