"""docs/FORMAT.md's layer-format tables are what scripts/format_table.py generates from the
format registry: the doc and ftw/formats/ cannot drift apart."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ftw.formats import FORMATS
from ftw.formats.base import BankSpec, ExpertFormat, Option, positive_int, register

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("format_table", ROOT / "scripts" / "format_table.py")
format_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(format_table)


def test_format_doc_matches_the_registry():
    doc = format_table.DOC.read_text()
    assert format_table.render(doc) == doc, "docs/FORMAT.md is stale: run python scripts/format_table.py"
    assert format_table.main(["--check"]) == 0


def test_every_format_bank_and_option_is_in_the_doc():
    doc = format_table.DOC.read_text()
    table = doc.split(format_table.BEGIN, 1)[1].split(format_table.END, 1)[0]
    for name, cls in FORMATS.items():
        assert f"| `{name}` | {cls.summary} |" in table
        for bank in cls.bank_names:
            assert f"| `{name}` | `{bank}`" in table, (name, bank)
        for opt in cls.options:
            assert f"| `{name}` | `{opt.name}` |" in table, (name, opt.name)


class _Doc(ExpertFormat):
    name = "doc_probe"
    summary = "test-only"
    bank_names = ("gate_up", "down", "gate_up_scale")
    options = (Option("group", positive_int, "inputs per scale", required=True),)

    @classmethod
    def banks(cls, H, I, options):  # noqa: E741
        return {"gate_up": BankSpec("gate_up", ("i8",), (2 * I, H)), "down": BankSpec("down", ("i8",), (H, I)),
                "gate_up_scale": BankSpec("gate_up_scale", ("f32",), (2 * I, H // options["group"]))}


@pytest.fixture
def probe_format():
    register(_Doc)
    try:
        yield _Doc
    finally:
        FORMATS.pop(_Doc.name)


def test_a_registry_change_makes_the_check_fail(probe_format, capsys):
    """The check can fail: a format the doc does not list is found, with its symbolic shapes."""
    table = format_table.format_table()
    assert "| `doc_probe` | `gate_up_scale` | f32 | [2I, H/group] |" in table
    assert "| `doc_probe` | `group` | a positive integer | yes | inputs per scale |" in table
    assert format_table.main(["--check"]) == 1
    assert "run python scripts/format_table.py" in capsys.readouterr().err
