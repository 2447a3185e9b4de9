"""Expert formats: one registered class per canonical format, and what a layer and a model say.

    FORMATS              name -> format class (bf16, fp8_block, nvfp4, mxfp4, ds_fp4, mxfp8,
                         affine, gguf); each class owns its banks, options and decoder
    get_format(name)     the class, or UnsupportedError
    LayerFormat          a layer's (name, options), validated against its class
    Activation           the model's activation (silu, silu with limit, swiglu_oai)
    ModelShape           the model's MoE shape
"""

from .base import FORMATS, BankSpec, ExpertFormat, Option, get_format, register
from .layer import ACTIVATIONS, Activation, LayerFormat, ModelShape

# importing a format module registers its class; the order is the docs' order
from . import bf16, fp8_block, nvfp4, mxfp4, ds_fp4, mxfp8, affine, gguf  # noqa: E402,F401  isort: skip

__all__ = [
    "FORMATS", "BankSpec", "ExpertFormat", "Option", "get_format", "register",
    "ACTIVATIONS", "Activation", "LayerFormat", "ModelShape",
]
