"""What `ftw inspect` reports about a container, as plain JSON-able data.

The JSON lists every blob with its file offset, byte size, dtype, shape and codec, so any
tool can find a bank's bytes without this package.
"""

from __future__ import annotations

from collections import defaultdict

from .container import FtwFile


def _blob(b) -> dict:
    return {"offset": b.offset, "nbytes": b.nbytes, "xxh3": b.xxh3}


def summarize(f: FtwFile, layers: list[int] | None = None) -> dict:
    chosen = sorted(f.layers) if layers is None else [l for l in layers if l in f.layers]
    by_format: dict[str, list[int]] = defaultdict(list)
    layer_rows = []
    described: dict = {}  # format -> (key, options): each parses the options JSON once
    for layer in chosen:
        fmt = f.layer_formats[layer]
        if fmt not in described:
            described[fmt] = (fmt.key(), fmt.options)
        key, options = described[fmt]
        by_format[key].append(layer)
        banks = []
        for name, b in f.layers[layer].items():
            banks.append({
                "name": name,
                "dtype": b.dtype,
                "shape": list(b.shape),
                "codec": b.codec,
                "bytes_per_expert": b.row_nbytes,
                "raw_nbytes": b.raw_nbytes,
                "stored_nbytes": b.blob.nbytes,
                "ratio": (b.raw_nbytes / b.blob.nbytes) if b.blob.nbytes else 1.0,
                **{"offset": b.blob.offset, "xxh3": b.blob.xxh3},
                **({"row_table": _blob(b.row_table)} if b.row_table else {}),
            })
        layer_rows.append({
            "layer": layer,
            "format": fmt.name,
            "options": options,
            "format_key": key,
            "banks": banks,
            "raw_nbytes": sum(b["raw_nbytes"] for b in banks),
            "stored_nbytes": sum(b["stored_nbytes"] for b in banks),
        })
    raw_by_format: dict[str, int] = defaultdict(int)  # one pass: inspect stays linear in the index
    for r in layer_rows:
        raw_by_format[r["format_key"]] += r["raw_nbytes"]
    formats = [
        {"format": key, "name": f.layer_formats[ls[0]].name, "options": f.layer_formats[ls[0]].options,
         "layers": ls, "raw_nbytes": raw_by_format[key]}
        for key, ls in by_format.items()
    ]
    tensors = [
        {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), **_blob(t.blob), **({"meta": t.meta} if t.meta else {})}
        for t in f.tensors.values()
    ]
    attachments = [{"name": n, **_blob(b)} for n, b in f.attachments.items()]
    expert_raw = sum(r["raw_nbytes"] for r in layer_rows)
    expert_stored = sum(r["stored_nbytes"] for r in layer_rows)
    return {
        "file": f.path,
        "file_nbytes": f.size,
        "version": list(f.version),
        "model": f.model.to_json() if f.model else None,
        "provenance": f.provenance,
        "formats": formats,
        "layers": layer_rows,
        "tensors": tensors,
        "attachments": attachments,
        "totals": {
            "moe_layers": len(layer_rows),
            "expert_raw_nbytes": expert_raw,
            "expert_stored_nbytes": expert_stored,
            "tensor_nbytes": sum(t["nbytes"] for t in tensors),
            "attachment_nbytes": sum(a["nbytes"] for a in attachments),
        },
    }
