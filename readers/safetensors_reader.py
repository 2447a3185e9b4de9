"""The reader for Hugging Face checkpoint folders: config.json plus safetensors shards.

    reader = SafetensorsReader(folder)          # or readers.open_checkpoint(folder)
    reader.model                                # ModelShape from config.json
    reader.layer_formats()                      # {layer: LayerFormat}, from headers only
    for lb in reader.plan([3, 4]):              # every name, dtype and shape checked first
        for bank, src in lb.banks.items():
            src.row(e)                          # zero-copy views of expert e's row

MTP (next-token prediction) modules are skipped: the `num_nextn_predict_layers` layers
numbered from num_hidden_layers on (DeepSeek, GLM) and `mtp.*` tensors are neither banks nor
plain tensors, unless ``keep_mtp=True``, which carries them byte for byte as plain tensors
(their experts included). Tensors of any other layer the config does not declare are an
error naming them: dropping them silently would lose a layer.
Per-expert activation calibration (`input_scale`, `input_global_scale`, `activation_scale`)
belongs to no bank and is dropped.
"""

from __future__ import annotations

import glob
import json
import os
import re
from functools import partial
from typing import Iterable

from ftw.banks import LayerBanks, SourceTensor
from ftw.errors import SourceError
from ftw.formats import LayerFormat
from ftw.layer_ranges import format_layers

from .base import CheckpointReader, load_json_object, register_opener
from .families import Dims, family_for
from .families.experts import layer_banks, layer_number, scan
from .safetensors_index import INDEX_FILE, SafetensorsIndex

ATTACHMENT_GLOBS = (
    "config.json",
    "generation_config.json",
    "hf_quant_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template*",
    "preprocessor_config.json",
    "processor_config.json",
)
MAX_ATTACHMENT_NBYTES = 64 << 20


def _load_json(path: str) -> dict:
    return load_json_object(path, "config")


class SafetensorsReader(CheckpointReader):
    def __init__(self, path: str | os.PathLike, *, keep_mtp: bool = False):
        self.path = os.fspath(path)
        self.config_path = os.path.join(self.path, "config.json")
        self.config = _load_json(self.config_path)
        self.family = family_for(self.config, self.config_path)
        self.model = self.family.shape()
        self.keep_mtp = keep_mtp
        self.index = SafetensorsIndex(self.path)
        self._groups = scan(self.family, self.index.names())
        m = self.model
        self._dims = Dims(m.num_experts, m.hidden_size, m.moe_intermediate_size)
        self._moe = set(m.moe_layers)
        self._resolved: dict[int, LayerBanks] = {}
        self._mtp_names = self._undeclared_layers()
        for L, g in sorted(self._groups.items()):
            if L < m.num_layers and L not in self._moe:
                raise SourceError(
                    f"{self.config_path}: layer {L} has expert tensors ({next(iter(g.names.values()))!r}) "
                    f"but the config makes it dense (MoE layers: {m.moe_layers})"
                )

    @property
    def name(self) -> str:
        return f"safetensors/{self.family.name}"

    def _undeclared_layers(self) -> set[str]:
        """Names of the MTP layers' tensors: layers num_hidden_layers .. + num_nextn_predict_layers
        - 1 (DeepSeek, GLM put them there). Tensors of any other layer the config does not
        declare are an error: converting without them would silently drop a layer."""
        prefixes = "|".join(re.escape(p) for p in self.family.layer_prefixes)
        layer_re = re.compile(rf"^(?:{prefixes})([^.]+)\.")
        n, mtp = self.model.num_layers, self.family.mtp_layers()
        mtp_names, undeclared = set(), {}
        for name in self.index.names():
            m = layer_re.match(name)
            if m is None or not m.group(1)[:1].isdigit():  # '٣' and '²' are digits too: checked
                continue
            L = layer_number(m.group(1), name)
            if L < n:
                continue
            if L < n + mtp:
                mtp_names.add(name)
            else:
                undeclared.setdefault(L, name)
        if undeclared:
            layers = sorted(undeclared)
            raise SourceError(
                f"{self.config_path}: tensors of layer{'s' if len(layers) > 1 else ''} "
                f"{format_layers(layers)} (e.g. {undeclared[layers[0]]!r}), which the config does not "
                f"declare: num_hidden_layers is {n}"
                + (f" and num_nextn_predict_layers {mtp}" if mtp else "")
            )
        return mtp_names

    def _is_mtp(self, name: str) -> bool:
        return name.startswith(self.family.mtp_prefixes) or name in self._mtp_names

    def _resolve(self, layer: int) -> LayerBanks:
        lb = self._resolved.get(layer)
        if lb is None:
            group = self._groups.get(layer)
            if group is None:
                first = self.family.expected_first(self._base_of(layer))
                raise SourceError(f"layer {layer}: missing expert tensor {first} (the layer has no expert tensors)")
            lb = self._resolved[layer] = layer_banks(self.family, group, self._dims, self.index)
        return lb

    def _base_of(self, layer: int) -> str:
        """Where `layer`'s experts would be, by analogy with a layer that has them."""
        fam = self.family
        for g in self._groups.values():
            p = next(p for p in fam.layer_prefixes if g.base.startswith(p))
            return f"{p}{layer}." + g.base[len(p) + len(str(g.layer)) + 1 :]
        return f"{fam.layer_prefixes[0]}{layer}.{fam.expert_blocks[0]}."

    def layer_formats(self) -> dict[int, LayerFormat]:
        return {L: self._resolve(L).format for L in self.model.moe_layers}

    def plan(self, layers: Iterable[int] | None = None) -> list[LayerBanks]:
        return [self._resolve(L) for L in self.wanted_layers(layers)]

    def tensors(self) -> list[SourceTensor]:
        experts = {n for L, g in self._groups.items() if L in self._moe for n in g.names.values()}
        out = []
        for name in self.index.names():
            if name in experts or (not self.keep_mtp and self._is_mtp(name)):
                continue
            info = self.index.info(name)
            out.append(SourceTensor(name, info.dtype, info.shape, partial(self.index.array, name)))
        return out

    def attachments(self) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for pattern in ATTACHMENT_GLOBS:
            for p in sorted(glob.glob(os.path.join(glob.escape(self.path), pattern))):
                base = os.path.basename(p)
                if base in out or not os.path.isfile(p):
                    continue
                if os.path.getsize(p) > MAX_ATTACHMENT_NBYTES:
                    raise SourceError(f"{p}: attachment larger than {MAX_ATTACHMENT_NBYTES} bytes")
                with open(p, "rb") as f:
                    out[base] = f.read()
        return out

    def source_files(self) -> list[str]:
        files = [self.config_path]
        index = os.path.join(self.path, INDEX_FILE)
        if os.path.exists(index):
            files.append(index)
        return files + list(self.index.shards)

    def release_pages(self) -> None:
        self.index.release_pages()

    def close(self) -> None:
        self.index.close()


@register_opener
def open_safetensors(path: str) -> SafetensorsReader | None:
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    if not os.path.exists(os.path.join(path, INDEX_FILE)) and not glob.glob(
        os.path.join(glob.escape(path), "*.safetensors")
    ):
        return None
    return SafetensorsReader(path)
