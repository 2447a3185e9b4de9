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


def _register_all() -> None:
    """Import every format module in this package: importing one registers its class, so
    adding a format is adding its module. The modules that hold no format are skipped."""
    import importlib
    import pkgutil

    support = {"base", "layer", "codes", "ggml_types"}
    order = ["bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "mxfp8", "affine", "gguf"]  # the docs' order
    names = [m.name for m in pkgutil.iter_modules(__path__) if m.name not in support]  # noqa: F821
    for name in sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n)):
        importlib.import_module(f"{__name__}.{name}")


_register_all()

__all__ = [
    "FORMATS", "BankSpec", "ExpertFormat", "Option", "get_format", "register",
    "ACTIVATIONS", "Activation", "LayerFormat", "ModelShape",
]
