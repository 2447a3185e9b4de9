"""The expert-format registry: one class per canonical format, registered by its name.

A format class owns everything the rest of ftw needs to know about its layers:

- ``banks(H, I, options)``: each bank's allowed dtypes and row shape (one expert's shape),
  which banks are optional (expert biases). Readers build their banks from it, the writer
  refuses anything else, and the loader and runtimes size their buffers by it.
- ``options``: a typed schema, validated whenever a LayerFormat is made or read.
- ``decode(rows, H, I, options)``: the float64 reference decoder of one expert, written from
  the formulas of LAYOUTS.md and nothing else.

Adding a format is one module with one class (see docs/ARCHITECTURE.md, "Adding a format").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np

from ..errors import FormatError, UnsupportedError

Rows = Mapping[str, np.ndarray]  # bank name -> one expert's row, as the file stores it
Weights = dict[str, np.ndarray]  # "gate" [I, H], "up" [I, H], "down" [H, I] (+ biases), float64


@dataclass(frozen=True)
class BankSpec:
    """One bank of a format at given H, I and options."""

    name: str
    dtypes: tuple[str, ...]  # accepted when writing; the first is the usual one
    row_shape: tuple[int, ...]
    optional: bool = False  # present where the model has it (expert biases)
    read_dtypes: tuple[str, ...] = ()  # also accepted in files of older writers (same bytes)

    def accepts(self, dtype: str, *, reading: bool = False) -> bool:
        return dtype in self.dtypes or (reading and dtype in self.read_dtypes)


# -- option schema ------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One option of a format: its name, what values it takes, and what it means."""

    name: str
    check: Callable[[Any], str | None]  # the value -> None if valid, else what was expected
    doc: str
    required: bool = False


def positive_int(v: Any) -> str | None:
    return None if type(v) is int and v > 0 else "a positive integer"


def positive_int_pair(v: Any) -> str | None:
    ok = isinstance(v, list) and len(v) == 2 and all(type(x) is int and x > 0 for x in v)
    return None if ok else "two positive integers [out, in]"


def one_of(*choices: Any) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices and type(v) is type(choices[0]) else "one of " + ", ".join(map(repr, choices))

    return check


# -- formats --------------------------------------------------------------------------------


class ExpertFormat:
    """Base of the format classes. Subclasses set `name`, `bank_names`, `options` and
    implement `banks` and `decode`; nothing else is per format."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""  # one line for docs and `ftw inspect`
    bank_names: ClassVar[tuple[str, ...]] = ()  # every bank the format may have, in order
    options: ClassVar[tuple[Option, ...]] = ()
    # option keys older writers put in layer formats that now live elsewhere (the activation
    # moved to the model): accepted when a file is read, refused when a format is made
    legacy_options: ClassVar[tuple[str, ...]] = ()
    required_options: ClassVar[tuple[tuple[str, ...], ...]] = ()  # alternatives: one set must be given

    @classmethod
    def banks(cls, H: int, I: int, options: Mapping[str, Any]) -> dict[str, BankSpec]:  # noqa: E741
        raise NotImplementedError

    @classmethod
    def decode(cls, rows: Rows, H: int, I: int, options: Mapping[str, Any]) -> Weights:  # noqa: E741
        raise NotImplementedError

    @classmethod
    def decode_projection(cls, parts: Mapping[str, Any], options: Mapping[str, Any]) -> np.ndarray:
        """One projection (gate, up or down) of one expert, decoded from the SOURCE tensors as
        the checkpoint stores them ({"weight", "scale", ...}: see Reference in ftw/banks.py) to
        float64 [out, in]. It shares no layout code with `decode`, which reads the fused banks:
        `ftw check` compares the two, so a reader that re-lays the source wrongly shows."""
        raise NotImplementedError

    @classmethod
    def infer_dims(cls, shapes: Mapping[str, tuple[int, ...]], options: Mapping[str, Any]) -> tuple[int, int]:
        """(H, I) from a layer's bank row shapes, for files whose index carries no model:
        every format stores down as [H, ...] rows and gate_up as [2I, ...] rows."""
        return shapes["down"][0], shapes["gate_up"][0] // 2

    @classmethod
    def check_options(cls, options: Mapping[str, Any], where: str, *, reading: bool = False) -> None:
        known = {o.name: o for o in cls.options}
        for key, value in options.items():
            opt = known.get(key)
            if opt is None:
                if reading and key in cls.legacy_options:
                    continue
                expected = ", ".join(known) or "none"
                raise FormatError(f"{where}: {cls.name} has no option {key!r} (options: {expected})")
            problem = opt.check(value)
            if problem:
                raise FormatError(f"{where}: {cls.name} option {key!r} must be {problem}, got {value!r:.60}")
        cls.check_combination(options, where)
        for opt in cls.options:
            if opt.required and opt.name not in options:
                raise FormatError(f"{where}: {cls.name} needs option {opt.name!r} ({opt.doc})")
        if cls.required_options and not any(set(alt) <= set(options) for alt in cls.required_options):
            alts = " or ".join("+".join(a) for a in cls.required_options)
            raise FormatError(f"{where}: {cls.name} needs options {alts}")

    @classmethod
    def check_combination(cls, options: Mapping[str, Any], where: str) -> None:
        """Rules between options (one excludes another); per format where needed."""

    @classmethod
    def check_banks(cls, shapes: Mapping[str, tuple[str, tuple[int, ...]]], H: int, I: int,  # noqa: E741
                    options: Mapping[str, Any], where: str, *, reading: bool = False) -> None:
        """Bank name -> (dtype, row shape) against the format: a missing required bank, an
        undeclared one, or a dtype or row shape that does not match is a FormatError."""
        specs = cls.banks(H, I, options)
        for name in shapes:
            if name not in specs:
                raise FormatError(f"{where}: bank {name!r} is not a bank of {cls.name} "
                                  f"(banks: {', '.join(specs)})")
        for name, spec in specs.items():
            if name not in shapes:
                if spec.optional:
                    continue
                raise FormatError(f"{where}: {cls.name} layer lacks bank {name!r}")
            dtype, row_shape = shapes[name]
            if not spec.accepts(dtype, reading=reading):
                want = "/".join(spec.dtypes + (spec.read_dtypes if reading else ()))
                raise FormatError(f"{where}: bank {name!r} is {dtype}, {cls.name} stores it as {want}")
            if tuple(row_shape) != spec.row_shape:
                raise FormatError(f"{where}: bank {name!r} has rows of shape {list(row_shape)}, "
                                  f"{cls.name} at H={H}, I={I} has {list(spec.row_shape)}")
        optional = [n for n, s in specs.items() if s.optional]
        present = [n for n in optional if n in shapes]
        if present and len(present) != len(optional):
            raise FormatError(f"{where}: {cls.name} layer has {', '.join(present)} without "
                              f"{', '.join(n for n in optional if n not in present)}")


FORMATS: dict[str, type[ExpertFormat]] = {}


def register(cls: type[ExpertFormat]) -> type[ExpertFormat]:
    if not cls.name or cls.name in FORMATS:
        raise ValueError(f"format class {cls.__name__}: name {cls.name!r} is empty or taken")
    FORMATS[cls.name] = cls
    return cls


def get_format(name: str) -> type[ExpertFormat]:
    try:
        return FORMATS[name]
    except KeyError:
        raise UnsupportedError(
            f"layer format {name!r} is not known to this ftw (known: {', '.join(FORMATS)})"
        ) from None


# -- helpers the format modules share --------------------------------------------------------


def split_gate_up(gate_up: np.ndarray, I: int, down: np.ndarray) -> Weights:  # noqa: E741
    return {"gate": gate_up[:I], "up": gate_up[I:], "down": down}


def add_biases(w: Weights, rows: Rows, I: int, decode: Callable[[np.ndarray], np.ndarray]) -> Weights:  # noqa: E741
    """Expert biases where the layer has them: gate_up_bias [2I] (gate then up), down_bias [H]."""
    if "gate_up_bias" in rows and rows["gate_up_bias"].size:
        gub = decode(rows["gate_up_bias"])
        w["gate_bias"], w["up_bias"] = gub[:I], gub[I:]
    if "down_bias" in rows and rows["down_bias"].size:
        w["down_bias"] = decode(rows["down_bias"])
    return w


def bias_banks(H: int, I: int, dtypes: tuple[str, ...], optional: bool) -> dict[str, BankSpec]:  # noqa: E741
    return {
        "gate_up_bias": BankSpec("gate_up_bias", dtypes, (2 * I,), optional),
        "down_bias": BankSpec("down_bias", dtypes, (H,), optional),
    }
