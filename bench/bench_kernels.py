"""CUDA expert kernels on the GPU: decode bandwidth and prefill TFLOP/s, against baselines
measured in the same run (issue 13, Performance).

    python3 bench/bench_kernels.py [--json PATH] [--quick] [--formats bf16,nvfp4,...]
    python3 bench/bench_kernels.py --sanitize     # one small decode + prefill per format
                                                   # (run it under compute-sanitizer)
    python3 bench/bench_kernels.py --variants classic,staged,nopdl   # also the other decode kernels
    ncu --kernel-name regex:experts_decode python3 bench/bench_kernels.py --profile --sizes deepseek-v3

Decode (top_k = 8) at two layer sizes: Qwen3-30B-A3B-like (H=2048, I=768, E=128) and
DeepSeek-V3-like (H=7168, I=2048, E=256). Each layer holds all E experts (random bytes in the
format's stored layout) behind an identity slot table; step s routes to experts 8s..8s+7
(mod E), so consecutive steps read different rows and a row is read again only after all E
experts' bytes (>= 4x the 60 MB L2 at every size and format) went by. Steps are captured in a
CUDA graph and timed with CUDA events: after 20 ms of warm-up replays, the median of 5 rounds of
--replays replays (the kernel, each variant and the ceiling alike, their rounds interleaved).

- effective bandwidth = bytes of the routed experts' rows (every bank: weights, scales,
  globals, biases) / time per step;
- ceiling = a read-only streaming kernel (ftw._runtime.cuda_stream_read) over the same number
  of bytes per step, also cycling through the layer's memory, captured and timed the same way;
- torch reference = the routed experts decoded to bf16 by torch operations, then torch
  matmuls per expert (dequantization included in its time), eager;
- T = 8 with the same 8 experts for every token vs T = 1; T = 8 with independent routings.

GGUF (issue 14): --formats gguf:Q4_K,gguf:Q8_0,... (every projection of that ggml type; random
quant bytes, small finite scales); there is no torch decoder of ggml types, so the baseline is
the ceiling alone; --cpu-baseline adds ftw's CPU executor (CpuMoeExecutor, every host core)
on the same T=1 step and prints GPU time / CPU time; --variants gguf-staged,gguf-loaded,
gguf-prefetched,gguf-table times each way of decoding ggml rows (FTW_GGUF_CUDA_DECODER) in the same run;
gguf-min-hilo,gguf-min-shift each way of applying a K-quant's min (FTW_GGUF_CUDA_MIN),
gguf-shared-generic,gguf-shared-ld each way the staged kernel reads its ring (FTW_GGUF_CUDA_SHARED).

Prefill: T = 2048 tokens, top_k = 8, uniform random routing, TFLOP/s (2 * T * K * 3 * H * I
flops per layer) against a torch bf16 matmul (8192^3) in the same run.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from ftw.formats import Activation, LayerFormat  # noqa: E402
from ftw.runtime import cuda_experts as ce  # noqa: E402

SIZES = {"qwen3-30b-a3b": (2048, 768, 128), "deepseek-v3": (7168, 2048, 256)}
FORMATS = ["bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "mxfp8"]
K = 8
L2_BYTES = 60 << 20
# decode kernels other than the default, selected by environment (csrc/cuda/experts_kernels.cuh)
VARIANTS = {"classic": {"FTW_CUDA_DECODE": "classic"},  # experts_decode (register-fed) for every format
            "staged": {"FTW_CUDA_DECODE": "staged"},  # experts_decode_staged for every format
            "nopdl": {"FTW_CUDA_PDL": "0"},  # staged phase 1 launched after phase 0 completes
            # gguf (csrc/formats/gguf/decoders.cuh): every type with a decoder of its own one way
            "gguf-staged": {"FTW_GGUF_CUDA_DECODER": "staged"},  # experts_decode_staged (shared memory)
            "gguf-loaded": {"FTW_GGUF_CUDA_DECODER": "loaded"},  # register-fed, bytes in registers
            "gguf-prefetched": {"FTW_GGUF_CUDA_DECODER": "prefetched"},  # register-fed, block in the L1
            "gguf-table": {"FTW_GGUF_CUDA_DECODER": "table"},  # the table-driven decoder
            # gguf types with mins (Q4_K, Q5_K, Q2_K): how scale and min are applied (FTW_GGUF_CUDA_MIN)
            "gguf-min-hilo": {"FTW_GGUF_CUDA_MIN": "hilo"},  # both as bf16 hi + lo pairs (ScaledMin)
            "gguf-min-shift": {"FTW_GGUF_CUDA_MIN": "shift"},  # c0 * scale taken off exactly (ShiftedMin)
            # how the staged kernel reads its ring (FTW_GGUF_CUDA_SHARED; default per type)
            "gguf-shared-generic": {"FTW_GGUF_CUDA_SHARED": "generic"},  # generic addresses, 8-byte spans
            "gguf-shared-ld": {"FTW_GGUF_CUDA_SHARED": "shared"}}  # ld.shared, spans shifted into place
# the staged kernel's byte-stream (gguf) copies and checks as before kOptCopy32 / kOptFull
# (FTW_CUDA_STAGED_BYTES=0, experts_kernels.cuh); with every type forced staged
VARIANTS.update({"gguf-bytes-0": {"FTW_CUDA_STAGED_BYTES": "0"},
                 "gguf-staged-bytes-0": {"FTW_GGUF_CUDA_DECODER": "staged", "FTW_CUDA_STAGED_BYTES": "0"}})
# the staged ring's stages for wide byte-stream chunks (gguf Q6_K, Q8_0; FTW_CUDA_STAGED_STAGES)
VARIANTS.update({f"stages{n}": {"FTW_CUDA_STAGED_STAGES": str(n)} for n in (2, 3, 4)})
# K-quants on float32 sub-block sums (FTW_GGUF_CUDA_SUBBLOCKS): "0" the bf16 decode as before for
# every one, "32" for the 16-value ones only (Q2_K's values table, Q3_K and Q6_K's bf16 decode)
VARIANTS["gguf-subblocks-0"] = {"FTW_GGUF_CUDA_SUBBLOCKS": "0"}
VARIANTS["gguf-subblocks-32"] = {"FTW_GGUF_CUDA_SUBBLOCKS": "32"}
VARIANTS["gguf-chunk-d-0"] = {"FTW_GGUF_CUDA_CHUNK_D": "0"}  # Q3_K / Q6_K: d * sc per sub-block (before KS2)
# gguf Q8_0 on float32 block sums (FTW_GGUF_CUDA_Q8_SUMS): "0" its bf16 decode as before
VARIANTS["gguf-q8-sums-0"] = {"FTW_GGUF_CUDA_Q8_SUMS": "0"}
# the kernel with a one-pair-column chunk body of Q4_K / Q5_K / Q8_0 on sums (kOptOneColumn; by
# default in phases of at least 12 16-row items per SM): "0" never (the full body), "1" always
VARIANTS["staged-one-0"] = {"FTW_CUDA_STAGED_ONE": "0"}
VARIANTS["staged-one-1"] = {"FTW_CUDA_STAGED_ONE": "1"}
# gguf Q4_K, Q5_K at T = 1 (the default: each lane of a quad on sub-blocks of its own, in two columns,
# kOptLaneBlocks | kOptLaneCols): lanes-0 the one-column body; lanes-1 / lanes-2 the lane blocks in one
# / two columns also for Q8_0 and at T > 1; with the one-column kernel forced at every size
VARIANTS["lanes-0"] = {"FTW_CUDA_STAGED_LANES": "0"}
VARIANTS["lanes-1"] = {"FTW_CUDA_STAGED_LANES": "1"}
VARIANTS["lanes-2"] = {"FTW_CUDA_STAGED_LANES": "2"}
VARIANTS["staged-one-1-lanes-0"] = {"FTW_CUDA_STAGED_ONE": "1", "FTW_CUDA_STAGED_LANES": "0"}
# gguf Q6_K, Q2_K (kOptLanes16: each lane of a quad on 4 sub-blocks of 16 values of its own; by
# default at T = 1): lanes6-0 never (the full body), lanes6-1 at any T (items of several pairs: the
# full body of the same kernel)
VARIANTS["lanes6-0"] = {"FTW_CUDA_STAGED_LANES6": "0"}
VARIANTS["lanes6-1"] = {"FTW_CUDA_STAGED_LANES6": "1"}
# Q2_K / Q3_K's scales in the mma with a pair of scales per sub-block (before K3's wide lanes, the default)
VARIANTS["gguf-wide-0"] = {"FTW_GGUF_CUDA_WIDE": "0"}
# the decoders on float32 sums (gguf K-quants, Q8_0, IQ types) copying whole-block chunks from the
# lane's piece address (kOptWholeCopy, the default; "0": kOptCopy32's counted copies); Q3_K's aligned
# chunk body (the default); "-0" without them, "-1" (as the default) forced on
VARIANTS["wholecopy-0"] = {"FTW_CUDA_STAGED_WHOLECOPY": "0"}
VARIANTS["gguf-aligned-0"] = {"FTW_GGUF_CUDA_ALIGNED": "0"}
VARIANTS["q3-off"] = {"FTW_CUDA_STAGED_WHOLECOPY": "0", "FTW_GGUF_CUDA_ALIGNED": "0"}
VARIANTS["wholecopy-1"] = {"FTW_CUDA_STAGED_WHOLECOPY": "1"}
VARIANTS["gguf-aligned-1"] = {"FTW_GGUF_CUDA_ALIGNED": "1"}
VARIANTS["q3-on"] = {"FTW_CUDA_STAGED_WHOLECOPY": "1", "FTW_GGUF_CUDA_ALIGNED": "1"}
# gguf Q4_0 / MXFP4: staged (rings of 2 stages) at every size ("0"), or never (register-fed, as
# before); by default where a phase has at least 12 items per SM (FTW_GGUF_CUDA_STAGED_ITEMS)
VARIANTS["gguf-staged-items-0"] = {"FTW_GGUF_CUDA_STAGED_ITEMS": "0"}
VARIANTS["gguf-staged-items-off"] = {"FTW_GGUF_CUDA_STAGED_ITEMS": "1000000"}
# gguf staged decode with tables for every type that has them (FTW_GGUF_CUDA_TABLES=1: the IQ
# grids copied into shared memory by loads and stores before the routing, Q2_K's values in
# registers; =async: the IQ grids by cp.async, overlapping the routing, the IQ types' default way),
# for none (=0: the IQ grids read from global memory, Q2_K's values by int_pairs); the default
# takes each type's Fast<T>::kTables. Also with every type forced staged.
VARIANTS.update({f"gguf-tables-{v}": {"FTW_GGUF_CUDA_TABLES": v} for v in ("0", "1", "async")})
VARIANTS.update({f"gguf-staged-tables-{v}": {"FTW_GGUF_CUDA_DECODER": "staged", "FTW_GGUF_CUDA_TABLES": v}
                 for v in ("0", "1")})
# the IQ types on float32 sub-block sums (FTW_GGUF_CUDA_INTSUMS): "0" the decode they had before
# (staged with decode_tables, IQ3_XXS register-fed); "1" every IQ type that way (IQ3_XXS too)
VARIANTS.update({f"gguf-intsums-{v}": {"FTW_GGUF_CUDA_INTSUMS": v} for v in ("0", "1")})
# the IQ grids in copies per lane (FTW_GGUF_CUDA_GRID_COPIES: 0 never, the single grid as before;
# 1 in every phase, also rows of fewer than 8 chunks)
VARIANTS.update({f"gguf-copies-{v}": {"FTW_GGUF_CUDA_GRID_COPIES": v} for v in ("0", "1")})
# gguf IQ4_NL / IQ4_XS / MXFP4 values as before (FTW_GGUF_CUDA_VALUES=0: IQ4's levels as two bf16 byte
# planes times the scale, MXFP4's e2m1 by shifts), against the default (IQ4: the levels plus 128 in
# one plane and a bf16 fma per pair; MXFP4: a multiply per e2m1 pair); also with every type staged
VARIANTS["gguf-values-0"] = {"FTW_GGUF_CUDA_VALUES": "0"}
VARIANTS["gguf-staged-values-0"] = {"FTW_GGUF_CUDA_DECODER": "staged", "FTW_GGUF_CUDA_VALUES": "0"}
# gguf Q4_0 / MXFP4 at T = 1 with the staged kernel's byte columns (kOptByteCols; FTW_GGUF_CUDA_UNITCOLS=1:
# staged also where the default is register-fed, each lane's units unscaled in a column of their own,
# the scales on the float32 sums) or without them (=0: the decode before); the default takes them
# where the staged kernel runs (Fast<T>::kByteColsDefault)
VARIANTS.update({f"gguf-unitcols-{v}": {"FTW_GGUF_CUDA_UNITCOLS": v} for v in ("0", "1")})
# gguf Q4_0 / MXFP4 / IQ4_NL / IQ4_XS at T = 1 with int8 units (kOptInt8; FTW_GGUF_CUDA_INT8=1 both
# phases, =gate_up / =down one: staged also where the default is register-fed, x or act quantized per
# 32-value group into int8 hi and lo planes before the phase, the units on mma m16n8k32 u8 x s8) or
# without them (=0); Q4_K / Q5_K phase 0 on int8 sub-block sums likewise (kOptInt8Sums, =1 or =gate_up),
# Q2_K both phases on int8 unit sums (kOptInt8Sums in kOptLanes16's kernel, =1, =gate_up, =down)
VARIANTS.update({f"int8-{v}": {"FTW_GGUF_CUDA_INT8": v} for v in ("0", "1", "gate_up", "down")})
# gguf IQ2_XXS / IQ2_XS: their int8 units run where a phase reads its grid in copies (rows of 8 chunks
# or more); with the copies forced in every phase (the qwen3-30b-a3b size's down too)
# gguf Q4_0 / IQ4_NL / IQ4_XS at T = 2..8 with int8 units (kOptInt8Tokens; FTW_GGUF_CUDA_INT8_T8=1 both
# phases, =gate_up / =down one, x or act quantized per token and 256-value chunk first) or without (=0;
# unset: in phases of many items)
VARIANTS.update({f"int8-t8-{v}": {"FTW_GGUF_CUDA_INT8_T8": v} for v in ("0", "1", "gate_up", "down")})
VARIANTS["int8-copies-1"] = {"FTW_GGUF_CUDA_INT8": "1", "FTW_GGUF_CUDA_GRID_COPIES": "1"}
# decode cases: (T, every token routed to the same experts)
CASES = {"1": (1, True), "8same": (8, True), "8indep": (8, False)}
CASES.update({f"{t}{r}": (t, r == "same") for t in (2, 3, 4) for r in ("same", "indep")})
# gguf at T = 2..8: the item count by the experts of tokens that all pick the same ones (the rule
# before "Routed experts in the item count"), instead of what independent tokens give on average
VARIANTS["routing-same"] = {"FTW_GGUF_CUDA_ROUTING": "same"}
# launch shapes: warps per block splitting a row, register-fed (ks*) or staged (sks*) decode
VARIANTS.update({f"ks{n}": {"FTW_CUDA_DECODE": "classic", "FTW_CUDA_KSPLIT": str(n)} for n in (1, 2, 4, 8)})
VARIANTS.update({f"sks{n}": {"FTW_CUDA_DECODE": "staged", "FTW_CUDA_STAGED_KSPLIT": str(n)} for n in (1, 2, 4)})
# register-fed decode shapes of the formats with a RegisterShape list (bf16, fp8_block: their
# cuda.cu): rs<i> the i-th after the default, rs-legacy RegisterShape<> in the legacy loop; "before"
# that with fp8_block's general scale lookup: the decode these formats had before the shapes
VARIANTS.update({f"rs{i}": {"FTW_CUDA_REGISTER_SHAPE": str(i)} for i in range(1, 5)})
VARIANTS["rs-legacy"] = {"FTW_CUDA_REGISTER_SHAPE": "legacy"}
VARIANTS.update({f"rs{i}-ks{n}": {"FTW_CUDA_REGISTER_SHAPE": str(i), "FTW_CUDA_KSPLIT": str(n)}
                 for i in range(1, 5) for n in (2, 4, 8)})
VARIANTS["fp8-any"] = {"FTW_CUDA_FP8_SCALES": "any"}  # fp8_block: the general scale lookup for 128 x 128 f32 too
VARIANTS["before"] = {"FTW_CUDA_REGISTER_SHAPE": "legacy", "FTW_CUDA_FP8_SCALES": "any"}
# staged kernel (experts_kernels.cuh): the fp4 decoders' previous decode (sopt0), phase 1 items
# split between blocks forced (parts2) or off (parts1); staged0: both as before
# staged kernel, rows of 16-byte units: sopt1 = before kOptLean / kOptActPerm (experts_kernels.cuh),
# slean / sperm = one of the two, swide = both at 128 registers per lane in both phases; swide-off /
# swide8 = the default with 128 registers for rows of no / at least 8 chunks (default: 24)
VARIANTS.update({"sopt1": {"FTW_CUDA_STAGED_OPT": "1"}, "slean": {"FTW_CUDA_STAGED_OPT": "lean"},
                 "sperm": {"FTW_CUDA_STAGED_OPT": "perm"}, "swide": {"FTW_CUDA_STAGED_OPT": "wide"},
                 "swide-off": {"FTW_CUDA_STAGED_WIDE": "1000000"}, "swide8": {"FTW_CUDA_STAGED_WIDE": "8"}})
# 32-row stages (kOptRows32, experts_kernels.cuh; by default for fp4 phases of >= 6 items of 32 rows
# per SM: deepseek-v3's two) never (rows32-off) or for rows of at least 1 / 8 / 24 chunks
# (deepseek-v3 fp4: gate_up 28, down 8; qwen3-30b-a3b fp4: 8 and 3; mxfp8 twice those)
VARIANTS.update({"rows32-off": {"FTW_CUDA_STAGED_ROWS32": "0"}, "rows32": {"FTW_CUDA_STAGED_ROWS32": "1"},
                 "rows32-8": {"FTW_CUDA_STAGED_ROWS32": "8"}, "rows32-long": {"FTW_CUDA_STAGED_ROWS32": "24"}})
# early weights (FTW_CUDA_EARLY_WEIGHTS, experts_kernels.cuh): a block's first chunks of its first
# expert in flight before its routing, where token 0's topk_ids name it; on by default for
# fp8_block (register-fed), off for bf16 and the staged kernel (by measurement): "early" turns it
# on everywhere (bf16, fp8_block; nvfp4, mxfp4, ds_fp4, mxfp8 staged), "early-off" off everywhere
VARIANTS["early"] = {"FTW_CUDA_EARLY_WEIGHTS": "1"}
VARIANTS["early-off"] = {"FTW_CUDA_EARLY_WEIGHTS": "0"}
# mxfp4 / ds_fp4's E8M0 scale pair in the staged kernel by one clamp and one multiply (kOptScale2,
# the default); scale2-off: by e8m0_bf16 and a shift, as before
VARIANTS["scale2-off"] = {"FTW_CUDA_STAGED_SCALE2": "0"}
# nvfp4 / mxfp4 / ds_fp4 at T = 1: the units' sums in the mma's columns, scales on the float32 sums
# (kOptUnitCols; the default where the decoder chooses it); unitcols-off: the decode with its HMUL2
# per 2 values, as before; unitcols-on: unit columns for every decoder that has them
VARIANTS["unitcols-off"] = {"FTW_CUDA_STAGED_UNITCOLS": "0"}
VARIANTS["unitcols-on"] = {"FTW_CUDA_STAGED_UNITCOLS": "1"}
# phase 0 as a programmatic dependent of the previous step's phase 1 (FTW_CUDA_PDL0, experts_kernels.cuh:
# phase0_wait): "pdl0" on, "pdl0-off" off, "pdl0-early" on with early weights everywhere; where a
# step's time goes: "only0" / "only1" launch only gate_up / only down (phase 1 launched after the
# previous one completes), each step's output then wrong (timing only)
VARIANTS.update({"pdl0": {"FTW_CUDA_PDL0": "1"}, "pdl0-off": {"FTW_CUDA_PDL0": "0"},
                 "pdl0-early": {"FTW_CUDA_PDL0": "1", "FTW_CUDA_EARLY_WEIGHTS": "1"},
                 "only0": {"FTW_CUDA_ONLY_PHASE": "0"}, "only1": {"FTW_CUDA_ONLY_PHASE": "1", "FTW_CUDA_PDL": "0"}})
# finer work in the staged kernel where a phase has few items per SM (kOptFine, FTW_CUDA_STAGED_FINE:
# rings of 2 stages, up to 4 warps per block for at most 2 chunks of an item per warp, gate_up at
# 80 registers, down's items in parts of 2 chunks at T = 1; by default mxfp8 at the qwen3-30b-a3b
# size) in both phases, gate_up only, down only, never ("fine-off"); "partmin2": down's parts of 2
# chunks with the 4-stage ring (FTW_CUDA_STAGED_PART_MIN)
VARIANTS.update({"fine": {"FTW_CUDA_STAGED_FINE": "both"}, "fine-gu": {"FTW_CUDA_STAGED_FINE": "gate_up"},
                 "fine-off": {"FTW_CUDA_STAGED_FINE": "off"},
                 "fine-down": {"FTW_CUDA_STAGED_FINE": "down"}, "partmin2": {"FTW_CUDA_STAGED_PART_MIN": "2"}})
VARIANTS.update({"sopt0": {"FTW_CUDA_STAGED_OPT": "0"}, "parts1": {"FTW_CUDA_STAGED_PARTS": "1"},
                 "parts2": {"FTW_CUDA_STAGED_PARTS": "2"},
                 "staged0": {"FTW_CUDA_STAGED_OPT": "0", "FTW_CUDA_STAGED_PARTS": "1"}})


def cdiv(a, b):
    return -(-a // b)


# ---- random layers on the GPU, in each format's stored bytes -----------------------------------


def _bytes(shape, dev, lo=0, hi=256, mask=None):
    t = torch.randint(lo, hi, shape, dtype=torch.uint8, device=dev)
    return t & mask if mask is not None else t


# gguf: byte offsets of a block's f16 scale fields (d, m, dmin), set to small finite values so
# random quant bytes decode to finite weights; MXFP4's e8m0 byte 0 is drawn from 118..123
GGUF_SCALES = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "IQ4_NL": [0],
               "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_XS": [0],
               "IQ2_XXS": [0], "IQ2_XS": [0], "IQ3_XXS": [0], "IQ3_S": [0], "MXFP4": []}


def gguf_rows(type_name: str, E: int, rows: int, n: int, dev) -> torch.Tensor:
    from ftw.formats.ggml_types import ggml_type_named

    t = ggml_type_named(type_name)
    b = _bytes((E, rows, n // t.block, t.nbytes), dev)
    for off in GGUF_SCALES[type_name]:
        b[..., off] = 0x19  # f16 0x1419 ~ 1e-3
        b[..., off + 1] = 0x14
    if type_name == "MXFP4":
        b[..., 0] = _bytes(b.shape[:-1], dev, 118, 124)
    return b.reshape(E, rows, -1)


def random_layer(name: str, H: int, I: int, E: int, dev) -> ce.LayerView:  # noqa: E741
    b = {}
    opts = {}
    if name.startswith("gguf"):  # "gguf:Q4_K": every projection of that ggml type; plain "gguf": Q4_K
        t = name.partition(":")[2] or "Q4_K"
        opts = {"gate_up_type": t, "down_type": t}
        b["gate_up"] = gguf_rows(t, E, 2 * I, H, dev)
        b["down"] = gguf_rows(t, E, H, I, dev)
        name = "gguf"
    e4m3 = dict(mask=0xBF)  # bit 6 clear: no NaN code (0x7F/0xFF), magnitudes up to 1.875
    if name == "bf16":
        b["gate_up"] = torch.randn((E, 2 * I, H), dtype=torch.bfloat16, device=dev) * 0.02
        b["down"] = torch.randn((E, H, I), dtype=torch.bfloat16, device=dev) * 0.02
    elif name == "fp8_block":
        opts["block_size"] = [128, 128]
        b["gate_up"] = _bytes((E, 2 * I, H), dev, **e4m3)
        b["down"] = _bytes((E, H, I), dev, **e4m3)
        b["gate_up_scale"] = torch.rand((E, 2 * cdiv(I, 128), cdiv(H, 128)), device=dev) * 1e-2
        b["down_scale"] = torch.rand((E, cdiv(H, 128), cdiv(I, 128)), device=dev) * 1e-2
    elif name == "mxfp8":
        b["gate_up"] = _bytes((E, 2 * I, H), dev, **e4m3)
        b["down"] = _bytes((E, H, I), dev, **e4m3)
        b["gate_up_scale"] = _bytes((E, 2 * I, H // 32), dev, 118, 124)
        b["down_scale"] = _bytes((E, H, I // 32), dev, 118, 124)
    elif name == "nvfp4":
        b["gate_up"] = _bytes((E, 2 * I, H // 2), dev)
        b["down"] = _bytes((E, H, I // 2), dev)
        b["gate_up_scale"] = _bytes((E, 2 * I, H // 16), dev, 0x30, 0x48)
        b["down_scale"] = _bytes((E, H, I // 16), dev, 0x30, 0x48)
        b["gate_up_global"] = torch.rand((E, 2 * I), device=dev) * 1e-3
        b["down_global"] = torch.rand((E, H), device=dev) * 1e-3
    elif name in ("mxfp4", "ds_fp4"):
        b["gate_up"] = _bytes((E, 2 * I, H // 2), dev)
        b["down"] = _bytes((E, H, I // 2), dev)
        b["gate_up_scale"] = _bytes((E, 2 * I, H // 32), dev, 118, 124)
        b["down_scale"] = _bytes((E, H, I // 32), dev, 118, 124)
        if name == "mxfp4":
            b["gate_up_bias"] = torch.randn((E, 2 * I), dtype=torch.bfloat16, device=dev)
            b["down_bias"] = torch.randn((E, H), dtype=torch.bfloat16, device=dev)
        else:
            opts["act_block"] = 128
    return ce.LayerView(LayerFormat.of(name, opts), b, torch.arange(E, dtype=torch.int32, device=dev))


def expert_nbytes(view: ce.LayerView) -> int:
    return sum(t[0].numel() * t.element_size() for t in view.banks.values())


# ---- the torch reference: decode to bf16 by torch ops, then matmuls per expert -----------------

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def torch_dequant(view: ce.LayerView, proj: str, e: int) -> torch.Tensor:
    name, b = view.format.name, view.banks
    w = b[proj][e]
    if name == "bf16":
        return w
    if name in ("fp8_block", "mxfp8"):
        v = w.view(torch.float8_e4m3fn).float()
    else:
        lut = torch.tensor(E2M1, device=w.device)
        v = torch.stack([lut[(w & 0xF).long()], lut[(w >> 4).long()]], dim=-1).reshape(w.shape[0], -1)
    s = b[proj + "_scale"][e]
    if name == "fp8_block":
        I = b["gate_up"].shape[1] // 2  # noqa: E741
        rows = torch.arange(v.shape[0], device=v.device)
        if proj == "gate_up":
            rb = torch.where(rows < I, rows // 128, cdiv(I, 128) + (rows - I) // 128)
        else:
            rb = rows // 128
        scale = s[rb].repeat_interleave(128, dim=1)[:, : v.shape[1]]
    elif name == "nvfp4":
        scale = s.view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=1) * b[proj + "_global"][e][:, None]
    else:
        scale = torch.exp2(s.float() - 127).repeat_interleave(32, dim=1)
    return (v * scale).to(torch.bfloat16)


def torch_reference(view: ce.LayerView, x: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor) -> torch.Tensor:
    I = view.banks["gate_up"].shape[1] // 2  # noqa: E741
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, kk = (ids == e).nonzero(as_tuple=True)
        gu = torch_dequant(view, "gate_up", e)
        h = x[tok] @ gu.T
        a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
        y = a @ torch_dequant(view, "down", e).T
        out.index_add_(0, tok, y.float() * wts[tok, kk][:, None])
    return out


# ---- timing -------------------------------------------------------------------------------------


# Timed work starts only after WARMUP_S of the same replays: a small step's first replays after an
# idle host phase (building the layer) ran up to 10% slow (clocks, caches). Warm-up alone did not
# remove the bias of order: at the qwen3 size bf16's default, timed first, read 0.61x of the
# ceiling where its variant column, the same kernel timed second, read 0.68-0.69x, in two runs
# (docs/BENCHMARKS.md). So the kernels compared in one run (the default, each variant, the
# ceiling) are captured first, then timed in interleaved rounds: round r of every kernel before
# round r + 1 of any, ROUNDS rounds, each kernel's median.
WARMUP_S, ROUNDS = 0.02, 5


class GraphTimer:
    """`steps` (callables) captured in one CUDA graph; `seconds(n)`: n replays, timed with events."""

    def __init__(self, steps):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for f in steps:
                f()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for f in steps:
                f()
        self.graph.replay()
        torch.cuda.synchronize()
        self.nsteps = len(steps)

    def seconds(self, n: int) -> float:
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(n):
            self.graph.replay()
        t1.record()
        torch.cuda.synchronize()
        return t0.elapsed_time(t1) / 1e3

    def warm_up(self) -> None:
        n, spent = 1, 0.0
        while spent < WARMUP_S:  # doubling batches of replays until the warm-up time is spent
            spent += self.seconds(n)
            n *= 2


def interleaved_times(timers: list[GraphTimer], replays: int) -> list[float]:
    """Seconds per step of each timer: each warmed up, then ROUNDS interleaved rounds of `replays`
    replays (round r of every timer before round r + 1 of any); each timer's median round."""
    rounds = [[] for _ in timers]
    for r in range(ROUNDS):
        for i, tm in enumerate(timers):
            if r == 0:
                tm.warm_up()
            rounds[i].append(tm.seconds(replays))
    return [sorted(rs)[ROUNDS // 2] / (replays * tm.nsteps) for rs, tm in zip(rounds, timers)]


def eager_time(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(reps):
        fn()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) / 1e3 / reps


def decode_plan(E: int, T: int, nsteps: int, same: bool, dev) -> list[torch.Tensor]:
    plans = []
    for s in range(nsteps):
        if same:
            row = [(K * s + j) % E for j in range(K)]
            ids = [row] * T
        else:
            ids = [[(K * T * s + K * t + j) % E for j in range(K)] for t in range(T)]
        plans.append(torch.tensor(ids, dtype=torch.int32, device=dev))
    return plans


def bench_decode(view: ce.LayerView, H: int, I: int, E: int, T: int, same: bool, dev, replays: int,  # noqa: E741
                 ceiling_buf: torch.Tensor, sink: torch.Tensor, variants: tuple = ()) -> dict:
    per_expert = expert_nbytes(view)
    nsteps = max(8, min(64, cdiv(E, K * (1 if same else T))))
    plans = decode_plan(E, T, nsteps, same, dev)
    distinct = [len(torch.unique(p)) for p in plans]
    step_bytes = sum(distinct) / nsteps * per_expert
    xs = [torch.randn((T, H), dtype=torch.bfloat16, device=dev) for _ in range(nsteps)]
    wts = torch.rand((T, K), device=dev)
    out = torch.empty((T, H), dtype=torch.float32, device=dev)
    ws = torch.empty(ce._runtime.cuda_experts_workspace_bytes(T, K, I, E, H), dtype=torch.uint8, device=dev)
    steps = [lambda s=s: ce.experts_forward(view, xs[s], plans[s], wts, "silu", out=out, ws=ws, check=False)
             for s in range(nsteps)]
    timers = [GraphTimer(steps)]
    for name in variants:  # other decode kernels (VARIANTS), same steps, same run: the env picks
        os.environ.update(VARIANTS[name])  # the kernels at capture, so the graphs keep them
        try:
            timers.append(GraphTimer(steps))
        finally:
            for k in VARIANTS[name]:
                del os.environ[k]
    # ceiling: stream the same number of bytes per step, cycling through the layer-sized buffer
    chunk = int(step_bytes) // 4096 * 4096
    nchunks = max(1, ceiling_buf.numel() // chunk)
    reads = [lambda i=i: ce.stream_read(ceiling_buf[(i % nchunks) * chunk:(i % nchunks + 1) * chunk], sink)
             for i in range(nsteps)]
    timers.append(GraphTimer(reads))
    t, *tv, t_ceiling = interleaved_times(timers, replays)
    t_variants = dict(zip(variants, tv))
    del timers
    r = {"T": T, "routing": "same" if same else "independent", "step_bytes": int(step_bytes),
         "us": t * 1e6, "GBps": step_bytes / t / 1e9, "ceiling_us": t_ceiling * 1e6,
         "ceiling_GBps": chunk / t_ceiling / 1e9}
    r["vs_ceiling"] = r["GBps"] / r["ceiling_GBps"]
    for name, tv in t_variants.items():
        r[f"{name}_us"] = tv * 1e6
        r[f"{name}_vs_ceiling"] = step_bytes / tv / 1e9 / r["ceiling_GBps"]
    if (T == 1 or same) and view.format.name != "gguf":  # no torch decoder of ggml types: ceiling only
        nref = min(nsteps, 8)
        t_ref = eager_time(lambda: [torch_reference(view, xs[s], plans[s], wts) for s in range(nref)], 2) / nref
        r["torch_us"] = t_ref * 1e6
        r["speedup_vs_torch"] = t_ref / t
    return r


def cpu_decode_time(view: ce.LayerView, H: int, E: int, nsteps: int = 8, reps: int = 3) -> dict:  # noqa: E741
    """--cpu-baseline: seconds per decode step (T=1, top_k=8) of ftw's CpuMoeExecutor on every core
    of this host, over the first min(E, 8 * nsteps) experts of the same layer copied to host memory;
    step s routes to experts 8s..8s+7, so a step reads rows no step before it in the round read."""
    import numpy as np

    from ftw.loader import ExpertBanks
    from ftw.runtime import CpuMoeExecutor

    n = min(E, K * nsteps)
    banks = {name: {0: t[:n].cpu().numpy()} for name, t in view.banks.items() if t.numel()}
    ex = CpuMoeExecutor(ExpertBanks(banks, {0: view.format}, n), activation=Activation("silu"))
    x = np.random.default_rng(0).standard_normal((1, H)).astype(np.float32)
    wts = np.full((1, K), 1.0 / K, dtype=np.float32)
    plans = [np.array([[(K * s + j) % n for j in range(K)]], dtype=np.int32) for s in range(nsteps)]
    for p in plans:  # warm-up: worker threads, first touch of the host copies
        ex.forward(0, x, p, wts)
    t0 = time.perf_counter()
    for _ in range(reps):
        for p in plans:
            ex.forward(0, x, p, wts)
    return {"cpu_us": (time.perf_counter() - t0) / (reps * nsteps) * 1e6, "cpu_threads": ex.threads}


def bench_prefill(view, H, I, E, dev, T=2048) -> dict:  # noqa: E741
    ids = torch.stack([torch.randperm(E, device=dev)[:K] for _ in range(T)]).to(torch.int32)
    x = torch.randn((T, H), dtype=torch.bfloat16, device=dev)
    wts = torch.rand((T, K), device=dev)
    out = torch.empty((T, H), dtype=torch.float32, device=dev)
    ws = torch.empty(ce._runtime.cuda_experts_workspace_bytes(T, K, I, E, H), dtype=torch.uint8, device=dev)
    t = eager_time(lambda: ce.experts_forward(view, x, ids, wts, "silu", out=out, ws=ws, check=False), 5)
    flops = 2.0 * T * K * 3 * H * I
    return {"T": T, "ms": t * 1e3, "TFLOPs": flops / t / 1e12}


def profile_steps(dev, sizes, formats) -> None:
    """A few eager T=1 decode steps per size and format, staged kernel then the classic one, for
    a profiler (ncu --kernel-name regex:experts_decode); no graph, no timing."""
    for size in sizes:
        H, I, E = SIZES[size]  # noqa: E741
        for name in formats:
            view = random_layer(name, H, I, E, dev)
            x = torch.randn((1, H), dtype=torch.bfloat16, device=dev)
            wts = torch.rand((1, K), device=dev)
            for s, mode in enumerate(("staged", "classic")):
                if mode == "classic":
                    os.environ["FTW_CUDA_DECODE"] = "classic"
                ids = torch.tensor([[(K * (s + 3) + j) % E for j in range(K)]], dtype=torch.int32, device=dev)
                ce.experts_forward(view, x, ids, wts, "silu", check=False)
                torch.cuda.synchronize()
                os.environ.pop("FTW_CUDA_DECODE", None)
                print(f"profile {size} {name} step {s}: {mode}", flush=True)
            del view
            torch.cuda.empty_cache()


def matmul_rate(dev, n=8192) -> float:
    a = torch.randn((n, n), dtype=torch.bfloat16, device=dev)
    b = torch.randn((n, n), dtype=torch.bfloat16, device=dev)
    t = eager_time(lambda: a @ b, 10)
    return 2.0 * n ** 3 / t / 1e12


def sanitize_case(dev) -> None:
    """Small decode and prefill steps of every format (for compute-sanitizer)."""
    torch.manual_seed(0)
    H, I, E = 256, 128, 16  # noqa: E741
    for name in [f for f in FORMATS if f in ce.cuda_formats()]:  # the safetensors formats (gguf: issue 14)
        view = random_layer(name, H, I, E, dev)
        for T, k in ((3, 4), (50, 4)):  # 12 pairs: decode tiles; 200 pairs: prefill tiles
            ids = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(T)]).to(torch.int32)
            out = ce.experts_forward(view, torch.randn((T, H), dtype=torch.bfloat16, device=dev), ids,
                                     torch.rand((T, k), device=dev), Activation("swiglu_oai", alpha=1.702, limit=7.0))
            torch.cuda.synchronize()
            print(f"sanitize {name} T={T}: finite={bool(torch.isfinite(out).all())}")


def accuracy(dev) -> list[dict]:
    """||out - ref|| / ||ref|| per format against the float64 reference of tests/test_cuda_kernels.py
    (decode T=8 and prefill T=150, values reaching the activation clamps)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import numpy as np
    import test_cuda_kernels as t

    rows = []
    for name in t.GPU_FORMATS:
        for T, Kk, spread in ((8, 8, 12.0), (150, 4, 4.0)):
            rng = np.random.default_rng([T, t.GPU_FORMATS.index(name)])
            H, I, E = 256, 160, 16  # noqa: E741
            opts, banks = t.make_banks(name, H, I, E, rng, biases=name in ("bf16", "mxfp4"), spread=spread)
            x, x64 = t.bf16_x(T, H, rng)
            ids, wts = t.routing(T, Kk, E, rng)
            act = t.ACTS["swiglu_oai"] if name == "mxfp4" else t.ACTS["silu_limit"]
            out = t.run(name, opts, banks, x, ids, wts, act)
            err = t.rel_err(out, t.Reference(name, opts, banks, H, I).forward(x64, ids, wts, act))
            rows.append({"format": name, "T": T, "rel_err": err})
            print(f"accuracy {name:9s} T={T:3d}: ||out - ref|| / ||ref|| = {err:.2e} (tolerance {t.tol(name):.0e})")
    return rows


def main() -> None:
    global WARMUP_S, ROUNDS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--warmup-ms", type=float, default=WARMUP_S * 1e3,
                    help="graph replays before timing (0 and --rounds 1: the timing before warm-up existed)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="timed rounds of --replays replays; their median")
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--cases", default="1,8same,8indep", help="decode cases to time: " + ",".join(CASES))
    ap.add_argument("--sanitize", action="store_true", help="only the small sanitizer case")
    ap.add_argument("--accuracy", action="store_true", help="also measure errors against float64")
    ap.add_argument("--variants", default="",
                    help="also time these decode kernels in the same run: " + ",".join(VARIANTS))
    ap.add_argument("--profile", action="store_true",
                    help="only a few eager T=1 decode steps per size and format (for ncu)")
    ap.add_argument("--cpu-baseline", action="store_true",
                    help="gguf formats: also time ftw's CPU executor on the same T=1 step (every host core)")
    args = ap.parse_args()
    WARMUP_S, ROUNDS = args.warmup_ms / 1e3, max(1, args.rounds)
    dev = torch.device("cuda")
    if args.profile:
        profile_steps(dev, args.sizes.split(","), args.formats.split(","))
        return
    if args.sanitize:
        sanitize_case(dev)
        return
    props = torch.cuda.get_device_properties(dev)
    res = {"device": props.name, "sms": props.multi_processor_count, "decode": [], "prefill": []}
    if args.accuracy:
        res["accuracy"] = accuracy(dev)
    res["matmul_bf16_TFLOPs"] = matmul_rate(dev)
    print(f"{props.name}: torch bf16 matmul 8192^3 {res['matmul_bf16_TFLOPs']:.0f} TFLOP/s", flush=True)
    sink = torch.zeros(1024, dtype=torch.int32, device=dev)
    variants = tuple(v for v in args.variants.split(",") if v)
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"--variants: unknown {v!r} (known: {', '.join(VARIANTS)})")
    for c in args.cases.split(","):
        if c not in CASES:
            ap.error(f"--cases: unknown {c!r} (known: {', '.join(CASES)})")
    cases = [CASES[c] for c in args.cases.split(",")]
    for size in args.sizes.split(","):
        H, I, E_size = SIZES[size]  # noqa: E741
        for name in args.formats.split(","):
            # the steps must cycle over weights of at least 4x the L2 (as over several layers): a
            # layer of 2-3-bit experts at the qwen3 size holds less (IQ3_XXS: 231 MB), so it
            # stands in for two or more layers with a multiple of E experts (a step still routes
            # top_k of them)
            E = E_size
            view = random_layer(name, H, I, E, dev)
            while expert_nbytes(view) * E < 4 * L2_BYTES:
                E *= 2
                view = random_layer(name, H, I, E, dev)
            layer_bytes = expert_nbytes(view) * E
            ceiling_buf = torch.empty(layer_bytes // 16 * 16, dtype=torch.uint8, device=dev).random_(0, 255)
            for T, same in cases:
                r = bench_decode(view, H, I, E, T, same, dev, args.replays, ceiling_buf, sink, variants)
                r.update(size=size, format=name)
                res["decode"].append(r)
                ref = f" torch {r['torch_us']:8.1f} us (x{r['speedup_vs_torch']:.1f})" if "torch_us" in r else ""
                print(f"decode {size:14s} {name:9s} T={T} {r['routing']:11s} {r['step_bytes'] / 2**20:7.1f} MiB "
                      f"{r['us']:8.1f} us {r['GBps']:6.0f} GB/s  ceiling {r['ceiling_GBps']:6.0f} GB/s "
                      f"= {r['vs_ceiling']:.2f}x{ref}", flush=True)
                for v in variants:
                    print(f"  {v:15s} {r[v + '_us']:8.1f} us = {r[v + '_vs_ceiling']:.2f}x ceiling "
                          f"(default / {v} time {r['us'] / r[v + '_us']:.2f})", flush=True)
            one = next((d for d in res["decode"] if d["size"] == size and d["format"] == name and d["T"] == 1), None)
            same8 = next((d for d in res["decode"] if d["size"] == size and d["format"] == name and d["T"] == 8
                          and d["routing"] == "same"), None)
            if one and same8:
                print(f"  T=8 same experts / T=1: {same8['us'] / one['us']:.2f}x", flush=True)
            if args.cpu_baseline and name.startswith("gguf") and one:
                one.update(cpu_decode_time(view, H, E))
                one["gpu_over_cpu"] = one["us"] / one["cpu_us"]
                print(f"  CPU executor T=1 ({one['cpu_threads']} threads): {one['cpu_us']:.0f} us; GPU / CPU time "
                      f"= {one['gpu_over_cpu']:.4f} ({1 / one['gpu_over_cpu']:.0f}x faster)", flush=True)
            if not args.no_prefill:
                p = bench_prefill(view, H, I, E, dev)
                p.update(size=size, format=name, vs_matmul=p["TFLOPs"] / res["matmul_bf16_TFLOPs"])
                res["prefill"].append(p)
                print(f"prefill {size:14s} {name:9s} T=2048 {p['ms']:8.2f} ms {p['TFLOPs']:6.1f} TFLOP/s "
                      f"= {p['vs_matmul']:.3f}x torch bf16 matmul", flush=True)
            del view, ceiling_buf
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    # summary table last (the device tool returns the end of the output)
    print("\nsize            format    T=1 GB/s  x ceil  x torch | T=8same/T=1 | T=8ind GB/s x ceil | prefill TFLOP/s")
    for size in args.sizes.split(","):
        for name in args.formats.split(","):
            d = {(r["T"], r["routing"]): r for r in res["decode"] if r["size"] == size and r["format"] == name}
            p = next((r for r in res["prefill"] if r["size"] == size and r["format"] == name), None)
            # a case left out by --cases prints as nan
            nan = collections.defaultdict(lambda: math.nan)
            a, s8, i8 = (d.get(c, nan) for c in ((1, "same"), (8, "same"), (8, "independent")))
            print(f"{size:15s} {name:9s} {a['GBps']:7.0f} {a['vs_ceiling']:7.2f} "
                  f"{a.get('speedup_vs_torch', math.nan):8.1f} | "
                  f"{s8['us'] / a['us']:11.2f} | {i8['GBps']:11.0f} {i8['vs_ceiling']:6.2f} | "
                  f"{p['TFLOPs'] if p else math.nan:8.1f}"
                  + "".join(f" | {v} x ceil {a[v + '_vs_ceiling']:.2f} {s8[v + '_us'] / a[v + '_us']:.2f} "
                            f"{i8[v + '_vs_ceiling']:.2f}" for v in variants)
                  + (f" | GPU/CPU executor time {a['gpu_over_cpu']:.4f}" if "gpu_over_cpu" in a else ""))


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"bench_kernels: {time.time() - t0:.0f} s", file=sys.stderr)
