"""No module outside a primitive's own package tests its opcode or name: every layer asks the registry.

Allowed: the spec (softdta/spec, which declares the built-ins' opcodes, sub-headers and names), the registry
(softdta/core/registry.py) and the primitives' own packages (softdta/core/primitives/). Naming a primitive to
build one of its reports, a structure of it or a label is not a test; comparing with it, or dispatching on it
(a table keyed by opcodes, a name mapped to code), is.
"""

import re
from pathlib import Path

from softdta.core import registry
from softdta.core.primitives import BUILT_IN
from softdta.spec import DtaOpcode

ROOT = Path(__file__).resolve().parents[2] / "softdta"
ALLOWED = (ROOT / "spec", ROOT / "core" / "registry.py", ROOT / "core" / "primitives")

OPCODE = r"DtaOpcode\.(?:{})".format("|".join(member.name for member in DtaOpcode))
NAME = r"[\"'](?:{})[\"']".format("|".join(re.escape(p.name) for p in registry.registered()))
CLASS = r"\b(?:{})\b".format("|".join(cls.__name__ for cls in BUILT_IN))
COMPARED = r"(?:\bis\b(?:\s+not)?|==|!=|\bin\b|\bcase\b)"
DISPATCH = [
    re.compile(rf"{COMPARED}\s*[\(\[{{]?\s*(?:{OPCODE}|{NAME})"),  # x is DtaOpcode.A, x in ("a", ...)
    re.compile(rf"(?:{OPCODE}|{NAME})\s*(?:{COMPARED})"),  # DtaOpcode.A == x
    re.compile(rf"{OPCODE}\s*:"),  # {DtaOpcode.A: ...}: a table per primitive
    re.compile(rf"{NAME}\s*:\s*lambda\b"),  # {"a": lambda: ...}: a dispatch per name
    re.compile(rf"isinstance\([^)]*{CLASS}"),
    re.compile(r"RX_KEY_WRITE\s*\+"),  # counters found by opcode arithmetic
]


def dispatch_lines(text: str) -> list[str]:
    """The lines of `text` that test a built-in primitive's opcode, name or class."""
    return [line.strip() for line in text.splitlines()
            if not line.lstrip().startswith("#") and any(pattern.search(line) for pattern in DISPATCH)]


def test_the_scanner_finds_each_way_of_switching_on_a_primitive():
    switching = [
        "if structure.primitive is DtaOpcode.KEY_WRITE:",
        "    if kind is not DtaOpcode.SKETCH_MERGE and slots:",
        "return opcode in (DtaOpcode.APPEND, DtaOpcode.POSTCARDING)",
        'if args.what == "key-write":',
        'taking = "append" == args.what',
        'regions = {DtaOpcode.KEY_INCREMENT: KeyIncrementRegion}',
        'workloads = {"sketch-merge": lambda: sketch()}',
        "    case DtaOpcode.APPEND:",
        "if isinstance(primitive, (Postcarding, Append)):",
        "counters[TranslatorCounter(TranslatorCounter.RX_KEY_WRITE + kind - 1)] += 1",
    ]
    assert dispatch_lines("\n".join(switching)) == [line.strip() for line in switching]
    naming = [
        "report = dta.key_write(key, data, 2)",
        'structure = {"primitive": "key-write", "slots": 4}',
        "kind = registry.by_opcode(structure.primitive)",
        "# a comment may say: if kind is DtaOpcode.APPEND",
        'primitive = "postcarding"  # a configured structure',
        'document = {"structures": [], "append": []}  # the tables\' [[append]] section',
        'cases = {"key-write": [dta.key_write(k, k, 2) for k in keys]}  # a benchmark\'s label',
    ]
    assert dispatch_lines("\n".join(naming)) == []


def test_no_layer_outside_a_primitive_switches_on_one():
    found = [f"{path.relative_to(ROOT.parent)}: {line}"
             for path in sorted(ROOT.rglob("*.py")) if not any(path.is_relative_to(a) for a in ALLOWED)
             for line in dispatch_lines(path.read_text())]
    assert not found, "ask the primitive (softdta.core.registry) instead:\n" + "\n".join(found)


def test_each_built_in_names_the_data_plane_code_that_implements_it():
    """What a primitive names of the data planes exists: its BPF header, included by the XDP program, and its
    sub-header's instance in the P4 programs, whose validity selects its path in both."""
    checkout = ROOT.parent
    translator_c = (checkout / "bpf" / "translator.bpf.c").read_text()
    p4_sources = {name: "".join(path.read_text() for path in paths) for name, paths in (
        ("v1model", [checkout / "p4" / "softdta_v1model.p4"]),
        ("tna", [checkout / "p4" / "softdta_tna.p4", *sorted((checkout / "p4" / "tna").glob("*.p4"))]))}
    for primitive in BUILT_IN:
        assert (checkout / "bpf" / "translator" / str(primitive.bpf_header)).is_file(), primitive.name
        assert f'#include "translator/{primitive.bpf_header}"' in translator_c, primitive.name
        for architecture, source in p4_sources.items():
            assert re.search(rf"hdr\.(dta\.)?{primitive.p4_header}\.isValid\(\)", source), (primitive.name,
                                                                                         architecture)
