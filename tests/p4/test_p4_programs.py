"""The P4 programs (p4/): a structural check that runs everywhere, and compiles where a P4 compiler exists.

No P4 compiler installs from the package registries here, so the structural check stands in for the parts of a
compile that concern the spec: every table, action, register, constant and field a program names exists in
the generated files with the spec's widths, and the unrolled loops (X-macros over the generated SOFTDTA_EACH_*
index lists) expand to the spec's limits. It reads the programs as the C preprocessor expands them, as p4c does.
"""

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from softdta import spec
from softdta.core.control_plane import CONFIG_TABLES
from softdta.targets.p4names import P4_WITHOUT, p4_control_tables, p4_registers
from softdta.targets.p4runtime import load_p4info
from softdta.wire import icrc_split
from tests.common import p4_tool

ROOT = Path(__file__).resolve().parents[2]
P4 = ROOT / "p4"
PROGRAMS = {"v1model": P4 / "softdta_v1model.p4", "tna": P4 / "softdta_tna.p4"}
# The hand-written sources of each program, in include order (the shared softdta_types.p4 aside).
SOURCES = {"v1model": ("softdta_v1model.p4",),
           "tna": ("softdta_tna.p4", "tna/parser.p4", "tna/ingress.p4", "tna/egress.p4")}
GENERATED = ("softdta_spec.p4", "softdta_tables.p4", "softdta_registers.p4", "softdta_tna_unrolled.p4")


def preprocessed(program: str, include: Path = P4) -> str:
    """The program as p4c's preprocessor sees it, with the architecture includes (core.p4, tna.p4, v1model.p4)
    empty: the structural check concerns softdta's own names. Its includes resolve in `include`."""
    with tempfile.TemporaryDirectory() as stubs:
        for name in ("core.p4", "tna.p4", "v1model.p4"):
            (Path(stubs) / name).write_text("")
        command = [shutil.which("cpp") or "clang", *([] if shutil.which("cpp") else ["-E"]),
                   "-x", "c", "-P", "-undef", "-nostdinc", "-I", stubs, "-I", str(include), "-"]
        result = subprocess.run(command, input=program, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def strip(text: str) -> str:
    """P4 without comments and string literals."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r'"[^"\n]*"', '""', text)


def header_fields(text: str) -> dict[str, dict[str, int]]:
    """header and struct types -> {field: width (bits) or 0 for a non-bit type}."""
    types = {}
    for kind, name, body in re.findall(r"^(header|struct) (\w+) \{\n(.*?)^\}", strip(text), re.M | re.S):
        fields = {}
        for declaration in body.split(";"):
            parts = declaration.split()
            if len(parts) < 2:
                continue
            width = re.fullmatch(r"bit<(\d+)>", parts[0])
            fields[re.sub(r"\[.*", "", parts[-1])] = int(width.group(1)) if width else 0
            if not width:
                fields.setdefault("_types", {})[re.sub(r"\[.*", "", parts[-1])] = re.sub(r"\[.*", "", parts[0])
        types[name] = fields
    return types


def member_types(types: dict, struct: str) -> dict[str, str]:
    return types[struct].get("_types", {})


def p4_problems(program: str, generated: dict[str, str], types_file: str) -> list[str]:
    """What in a P4 program does not match the generated definitions (empty when all is well)."""
    problems = []
    code = strip(program)
    for opening, closing in ("{}", "()", "[]"):
        if code.count(opening) != code.count(closing):
            problems.append(f"unbalanced {opening}{closing}: {code.count(opening)} vs {code.count(closing)}")
    everything = "\n".join(list(generated.values()) + [types_file, program])
    types = header_fields(everything)
    tables = {t.name: t for t in p4_control_tables()}
    for name in set(re.findall(r"\b(\w+)\.apply\(\)", code)):
        if name not in tables and not re.search(rf"\btable {name}\b", code):
            problems.append(f"applies table {name}, which is neither generated nor declared")
    for table, part, field in set(re.findall(r"meta\.tables\.(\w+?)(_key)?\.(\w+)", code)):
        if table not in tables:
            problems.append(f"meta.tables.{table}: no such control-plane table")
            continue
        fields = tables[table].key if part else tables[table].value
        if field not in {f.name for f in fields}:
            problems.append(f"meta.tables.{table}{part}.{field}: not a field of the spec table")
    registers = {r.name for r in p4_registers()}
    for macro in set(re.findall(r"\bSOFTDTA_REGISTER_(\w+)", code)):
        if macro.lower() not in registers:
            problems.append(f"SOFTDTA_REGISTER_{macro}: no such generated register")
    declared = {m.lower() for m in re.findall(r"\bSOFTDTA_REGISTER_(\w+)", code)}
    for group in re.findall(r"\bSOFTDTA_(\w+)_REGISTERS\b", code):
        declared |= {r.name for r in p4_registers() if r.table == group.lower()}
    declared |= set(re.findall(r"\b[Rr]egister<[^;{]*?>\s*\((?:[^()]|\([^()]*\))*\)\s*(\w+);", code))
    used = set(re.findall(r"\b(\w+)\.(?:read|write)\(", code))
    used |= set(re.findall(r"\bRegisterAction<[^;{]*?>\s*\((\w+)\)", code))
    for name in used - declared:
        problems.append(f"register {name} is used but not declared")
    # TNA externs: every register action executed and every hash unit read is declared.
    actions = set(re.findall(r"\bRegisterAction<[^;{]*?>\s*\(\w+\)\s*(\w+)\s*=", code))
    for name in set(re.findall(r"\b(\w+)\.execute\(", code)) - actions:
        problems.append(f"register action {name} is executed but not declared")
    hashes = set(re.findall(r"\bHash<[^;{]*?>\s*\([^;]*?\)\s*(\w+);", code))
    hashes |= {f"independent_{n}" for n in re.findall(r"\bKEY_HASH_UNIT\((\d+)\)", code)}
    for name in set(re.findall(r"\b(\w+)\.get\(\{", code)) - hashes:
        problems.append(f"hash unit {name} is used but not declared")
    known = set(re.findall(r"\bconst [\w<>]+ (\w+)\s*=", everything))
    known |= set(re.findall(r"#define (\w+)", everything))
    known |= {"PORT_METADATA_SIZE"}  # from tna.p4
    for name in set(re.findall(r"\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b", code)):
        if name not in known and not name.startswith(("SOFTDTA_REGISTER_",)):
            problems.append(f"constant {name} is not defined")
    for name, fields in types.items():
        for member, kind in fields.get("_types", {}).items():
            if kind not in types and kind not in ("bool",):
                problems.append(f"{name}.{member} has type {kind}, which is not defined")
    headers = member_types(types, "headers_t")
    roots = {"hdr": headers}
    if "tna_headers_t" in types:
        roots["hdr"] = {**member_types(types, "tna_headers_t"), **{f"dta.{k}": v for k, v in headers.items()}}
    for path, field in set(re.findall(r"\bhdr\.((?:dta\.)?\w+)(?:\[\w+\])?\.(\w+)\b", code)):
        kind = roots["hdr"].get(path)
        if kind is None:
            problems.append(f"hdr.{path}: no such header")
        elif kind in types and field not in types[kind] and field not in ("isValid", "setValid", "setInvalid", "next",
                                                         "push_front", "pop_front"):
            problems.append(f"hdr.{path}.{field}: {kind} has no such field")
    return problems


def read_generated() -> dict[str, str]:
    return {name: (P4 / name).read_text() for name in GENERATED}


@pytest.mark.parametrize("architecture", sorted(PROGRAMS))
def test_program_matches_the_generated_definitions(architecture):
    problems = p4_problems(preprocessed(PROGRAMS[architecture].read_text()), read_generated(),
                           (P4 / "softdta_types.p4").read_text())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("mutation,expected", [
    (lambda p: p.replace("qp_by_local_qpn.apply()", "qp_by_local_qpns.apply()", 1), "applies table qp_by_local_qpns"),
    (lambda p: p.replace("meta.tables.qp.rkey", "meta.tables.qp.r_key", 1), "meta.tables.qp.r_key"),
    (lambda p: p.replace("hdr.bth.psn", "hdr.bth.sequence", 1), "hdr.bth.sequence"),
    (lambda p: p.replace("qp_state_next_psn.read(", "qp_next_psn.read(", 1), "register qp_next_psn"),
    (lambda p: p.replace("CNT_DROP_GRACE", "CNT_DROP_GRACE_PERIOD", 1), "constant CNT_DROP_GRACE_PERIOD"),
    (lambda p: p.replace("apply {", "apply {{", 1), "unbalanced {}"),
    (lambda p: p.replace("V1Switch(", "struct broken_t {\n    missing_t m;\n}\nV1Switch(", 1),
     "missing_t, which is not"),
])
def test_structural_check_finds_mistakes(mutation, expected):
    assert_finds("v1model", mutation, expected)


@pytest.mark.parametrize("mutation,expected", [
    (lambda p: p.replace("hdr.bridge.qp_index", "hdr.bridge.qp_idx", 1), "hdr.bridge.qp_idx"),
    (lambda p: p.replace("hdr.dta.aeth.syndrome", "hdr.dta.aeth.syndrom", 1), "hdr.dta.aeth.syndrom"),
    (lambda p: p.replace("SOFTDTA_REGISTER_QP_STATE_FRAMES_SENT", "SOFTDTA_REGISTER_QP_STATE_FRAME_COUNT", 1),
     "SOFTDTA_REGISTER_QP_STATE_FRAME_COUNT"),
    (lambda p: p.replace("icrc_constant.apply()", "icrc_constants.apply()", 1), "applies table icrc_constants"),
    (lambda p: p.replace("append_list.apply()", "append_lists.apply()", 1), "applies table append_lists"),
    (lambda p: p.replace("append_slot_##i.execute(", "append_slots_##i.execute(", 1), "register action append_slots_7"),
    (lambda p: p.replace("(append_word_##i) append_slot_##i", "(append_words_##i) append_slot_##i", 1),
     "register append_words_3"),
    (lambda p: p.replace("postcard_value_##i.execute(", "postcard_val_##i.execute(", 1),
     "register action postcard_val_5"),
    (lambda p: p.replace("claim_entry.execute(", "claim.execute(", 1), "register action claim"),
    (lambda p: p.replace("sketch_take_##i.execute(", "sketch_take_9##i.execute(", 1), "register action sketch_take_90"),
    (lambda p: p.replace("SOFTDTA_EACH_POSTCARD_WORD(HOP_HASH_UNIT)", "SOFTDTA_EACH_HOP(HOP_HASH_UNIT)", 1),
     "hash unit hop_hash_0"),
    (lambda p: p.replace("hdr.dta.gather.left", "hdr.dta.gather.remaining", 1), "hdr.dta.gather.remaining"),
    (lambda p: p.replace("hdr.dta.postcard.hop", "hdr.dta.postcard.hops", 1), "hdr.dta.postcard.hops"),
    (lambda p: p.replace("hdr.chunks[c].w0", "hdr.chunks[c].w8", 1), "hdr.chunks.w8"),
    (lambda p: p.replace("WORDS_##n(hdr.lead_##n)", "WORDS_##n(hdr.leads_##n)", 1), "hdr.leads_3: no such header"),
    (lambda p: p.replace("chunk_##c.get(", "chunk_0##c.get(", 1), "hash unit chunk_06"),
    (lambda p: p.replace("head_imm_lead_##n.get(", "head_imm_lead##n.get(", 1), "hash unit head_imm_lead4"),
    (lambda p: p.replace("tail_lead_##n##_h lead_##n;", "tail_leads_##n##_h lead_##n;", 1),
     "tna_headers_t.lead_2 has type tail_leads_2_h, which is not defined"),
    (lambda p: p.replace("hdr.lead_##n.isValid()", "hdr.lead##n.isValid()", 1), "hdr.lead1: no such header"),
    (lambda p: p.replace("meta.tables.append_list.first_slot", "meta.tables.append_list.first", 1),
     "meta.tables.append_list.first"),
    (lambda p: p.replace("BRIDGE_ICRC_PASS;", "BRIDGE_ICRC_PASSES;", 1), "constant BRIDGE_ICRC_PASSES"),
    (lambda p: p.replace("pass_gate.execute(", "pass_gates.execute(", 1), "register action pass_gates"),
    (lambda p: p.replace("(qp_gate) start_grace", "(qp_gates) start_grace", 1), "register qp_gates"),
])
def test_structural_check_finds_mistakes_in_tna(mutation, expected):
    assert_finds("tna", mutation, expected)


def assert_finds(architecture: str, mutation, expected: str) -> None:
    """The check finds `expected` once `mutation` changes the first of the program's sources it changes."""
    with tempfile.TemporaryDirectory() as copy:
        tree = Path(copy) / "p4"
        shutil.copytree(P4, tree)
        for name in SOURCES[architecture]:
            source = (tree / name).read_text()
            if mutation(source) != source:
                (tree / name).write_text(mutation(source))
                break
        else:
            raise AssertionError("the mutation changes no source")
        program = preprocessed((tree / SOURCES[architecture][0]).read_text(), include=tree)
    problems = p4_problems(program, read_generated(), (P4 / "softdta_types.p4").read_text())
    assert any(expected in problem for problem in problems), problems


def test_tna_unrolled_parts_cover_the_spec_limits():
    """The TNA program has one register per word a record reads at once and one hash unit per tail piece:
    as many as the spec allows, with the chunk layout of icrc_split."""
    program = strip(preprocessed(PROGRAMS["tna"].read_text()))
    count = lambda pattern: len(set(re.findall(pattern, program)))  # noqa: E731
    assert count(r"\bRegister<[^;]*?\)\s*append_word_(\d+);") == spec.TNA_MAX_APPEND_BATCH
    assert count(r"\bappend_slot_(\d+)\.execute\(") == spec.TNA_MAX_APPEND_BATCH
    assert count(r"\bRegister<[^;]*?\)\s*postcard_hop_(\d+);") == spec.MAX_POSTCARD_HOPS
    assert count(r"\bpostcard_value_(\d+)\.execute\(") == spec.MAX_POSTCARD_HOPS
    assert count(r"\bhop_hash_(\d+)\.get\(") == spec.MAX_POSTCARD_HOPS
    assert count(r"\bRegister<[^;]*?\)\s*sketch_row_(\d+);") == spec.TNA_MAX_SKETCH_ROWS
    for action in ("sketch_sum", "sketch_max", "sketch_take"):
        assert count(rf"\b{action}_(\d+)\.execute\(") == spec.TNA_MAX_SKETCH_ROWS, action
    assert f"pop_front({spec.MAX_SKETCH_ROWS})" in program
    words = int(re.search(r"TAIL_CHUNK_WORDS = (\d+);", program).group(1))
    assert 4 * words == icrc_split.TAIL_CHUNK_BYTES
    assert int(re.search(r"TAIL_CHUNKS_PER_PASS = (\d+);", program).group(1)) == icrc_split.TAIL_CHUNKS_PER_PASS
    chunks = spec.MAX_WRITE_PAYLOAD // icrc_split.TAIL_CHUNK_BYTES
    assert f"tail_chunk_h[{chunks}] chunks;" in program
    assert count(r"\bchunk_(\d+)\.get\(") == chunks
    byteswapped_tail = "((tail)[7:0] ++ (tail)[15:8] ++ (tail)[23:16] ++ (tail)[31:24])"  # BYTESWAP32(tail)
    for c in range(chunks):  # chunk c continues the CRC in its first word, with all its words
        call = re.search(rf"\bchunk_{c}\.get\(\{{([^}}]*)\}}\)", program).group(1)
        assert [w.strip() for w in call.split(",")] == \
            [f"{byteswapped_tail} ^ hdr.chunks[{c}].w0"] + [f"hdr.chunks[{c}].w{i}" for i in range(1, words)]
    # The second egress pass continues with the chunks the first pass leaves.
    second_pass = program.split("if (hdr.bridge.kind == BRIDGE_ICRC_PASS) {")[1].split("finish_icrc();")[0]
    assert sorted(map(int, re.findall(r"\bchunk_(\d+)\.get\(", second_pass))) == \
        list(range(icrc_split.TAIL_CHUNKS_PER_PASS, chunks))
    for lead in range(words):  # one unit per lead length, with and without ImmDt, hashing the lead words
        for unit in (f"head_lead_{lead}", f"head_imm_lead_{lead}"):
            call = re.search(rf"\b{unit}\.get\(\{{([^}}]*)\}}\)", program).group(1)
            fields = [field.strip() for field in call.split(",")]
            assert [f for f in fields if f.startswith("hdr.lead_")] == [f"hdr.lead_{lead}.w{i}" for i in range(lead)]
            assert fields[len(fields) - lead:] == [f"hdr.lead_{lead}.w{i}" for i in range(lead)]
            assert ("hdr.bridge.immediate" in fields) == ("imm" in unit)


# A family written out by hand: an X-macro applied to a literal index, or a member named by an index past 0
# (lead_3, offset_5, column_bytes_12, chunk_6, w7). Index 0 may be named: the first word, the lead of none.
HAND_UNROLLED = re.compile(r"\b[A-Z_]+\(\d+\)|\b[a-z]\w*_[1-9]\d*\b|\.w[1-9]\d*\b")


@pytest.mark.parametrize("source", SOURCES["tna"])
def test_tna_writes_no_family_by_hand(source):
    """Every family of the TNA program (lead headers, hash units, parser states, lookup entries) comes from the
    generated softdta_tna_unrolled.p4 or an index list; the hand-written sources name no member."""
    assert not HAND_UNROLLED.findall(strip((P4 / source).read_text()))
    unrolled = strip((P4 / "softdta_tna_unrolled.p4").read_text())
    assert HAND_UNROLLED.findall(unrolled)  # the pattern finds families where they are


def const_entries(program: str, table: str) -> dict[int, str]:
    """key -> action call of a table's const entries."""
    body = re.search(rf"\btable {table} \{{.*?const entries = \{{(.*?)\}}\s*size", program, re.S).group(1)
    return {int(key, 0): call.strip() for key, call in re.findall(r"(\w+) : ([^;]+);", body)}


def test_tna_lookups_follow_the_spec():
    """The lookups that stand for shifts by a packet's value hold exactly the values the spec allows."""
    program = strip(preprocessed(PROGRAMS["tna"].read_text()))
    hops = range(1, spec.MAX_POSTCARD_HOPS + 1)
    assert const_entries(program, "hop_bits") == {h: f"set_hop_bit({1 << h - 1})" for h in hops}
    assert const_entries(program, "complete_masks") == {h: f"set_complete_mask({(1 << h) - 1})" for h in hops}
    reporters = range(1 << spec.P4_SKETCH_REPORTER_BITS)
    assert const_entries(program, "reporter_bits") == {r: f"set_reporter_bit({1 << r:#x})" for r in reporters}
    assert const_entries(program, "everyone_masks") == \
        {r + 1: f"set_everyone({(1 << r + 1) - 1:#x})" for r in reporters}
    assert const_entries(program, "fleet_slot_masks") == \
        {n: f"set_fleet_slot_mask({(1 << n) - 1:#x})" for n in range(1, spec.MAX_SLOT_BITS + 1)}
    # slot * size and column * rows * 4 as sums of shifts: each entry's action, evaluated for a value of 1. Slots
    # are powers of two: one entry each for a Postcarding path of 1..MAX_POSTCARD_HOPS hops and for a key's
    # checksum and 1..MAX_DATA_LEN data bytes.
    fits = lambda sizes: {1 << (size - 1).bit_length() for size in sizes}  # noqa: E731
    ingress, egress = program.split("control SoftdtaEgress(")  # both have actions offset_<shift>
    for control, table, variable, expected in (
            (ingress, "postcard_slot_offset", "offset", {size: size for size in fits(4 * h for h in hops)}),
            (egress, "slot_offset", "slot", {size: size for size in fits(
                range(spec.KEY_CHECKSUM_LEN + 1, spec.KEY_CHECKSUM_LEN + spec.MAX_DATA_LEN + 1))}),
            (ingress, "sketch_group_offset", "offset", {r: 4 * r for r in range(1, spec.MAX_SKETCH_ROWS + 1)})):
        products = {}
        for key, call in const_entries(control, table).items():
            action = re.escape(call.removesuffix("()"))
            expression = re.search(rf"\baction {action}\(\) \{{ offset = ([^;]*); \}}", control).group(1)
            products[key] = eval(re.sub(rf"\b{variable}\b", "1", expression))
        assert products == expected, table


def test_unrolled_loops_cover_the_spec_limits():
    """P4 has no loops: the v1model program unrolls them, once per element the spec allows."""
    program = strip(PROGRAMS["v1model"].read_text())
    # no index list by hand: every unrolled loop runs over a list codegen makes from the spec's maxima
    assert not re.findall(r"\b[A-Z_]+\(\d+\)", program)
    loops = re.findall(r"\bSOFTDTA_EACH_(\w+)\((\w+)\)", program)
    assert sorted(loops) == sorted([("APPEND_WORD", "APPEND_WORD"), ("HOP", "HOP_HASH"),
                                    ("POSTCARD_WORD", "POSTCARD_WORD"), ("POSTCARD_WORD", "POSTCARD_WORD"),
                                    ("POSTCARD_WORD", "POSTCARD_WORD"),
                                    ("POSTCARD_WORD", "POSTCARD_RESET"), ("SKETCH_ROW", "MERGE_ROW"),
                                    ("EXTRA_COPY", "COPY_HASH"), ("PAYLOAD_WORD", "TAIL_WORD")])
    generated = (P4 / "softdta_spec.p4").read_text()
    indexes = {name: [int(i) for i in re.findall(r"X\((\d+)\)", body)]
               for name, body in re.findall(r"#define SOFTDTA_EACH_(\w+)\(X\) ([^/\n]*)", generated)}
    assert indexes == {"APPEND_WORD": list(range(spec.MAX_APPEND_BATCH)),
                       "POSTCARD_WORD": list(range(spec.MAX_POSTCARD_HOPS)),
                       "HOP": list(range(1, spec.MAX_POSTCARD_HOPS + 1)),
                       "SKETCH_ROW": list(range(spec.MAX_SKETCH_ROWS)),
                       "TNA_APPEND_WORD": list(range(spec.TNA_MAX_APPEND_BATCH)),
                       "TNA_SKETCH_ROW": list(range(spec.TNA_MAX_SKETCH_ROWS)),
                       "PAYLOAD_WORD": list(range(spec.MAX_WRITE_PAYLOAD // 4)),
                       "EXTRA_COPY": list(range(1, spec.MAX_REDUNDANCY))}  # copy 0 hashes alike in every scheme
    assert f"pop_front({spec.MAX_SKETCH_ROWS})" in program
    # Register index layouts: each record's parts fit the bits the spec gives them.
    assert 1 << spec.P4_APPEND_BATCH_BITS == spec.MAX_APPEND_BATCH
    assert 1 << spec.P4_POSTCARD_WORD_BITS == spec.MAX_POSTCARD_HOPS == spec.MAX_KEY_LEN // 4
    assert 1 << spec.P4_SKETCH_ROW_BITS == spec.MAX_SKETCH_ROWS
    assert 1 << spec.P4_SKETCH_REPORTER_BITS == 32  # contributors: a bitmap in a 32-bit register
    sizes = {r.name: r.size for r in p4_registers()}
    columns = sizes["sketch_column_contributors"]
    assert sizes["sketch_column_counters"] == columns << spec.P4_SKETCH_ROW_BITS
    assert sizes["postcard_cache_values"] == sizes["postcard_cache_valid"] << spec.P4_POSTCARD_WORD_BITS
    assert sizes["append_state_data"] >= sizes["append_state_pending"] << spec.P4_APPEND_BATCH_BITS
    assert columns >> spec.P4_SKETCH_COLUMN_BITS << spec.P4_SKETCH_REPORTER_BITS <= \
        sizes["sketch_reporter_next_column"]


def test_generated_ids_and_names_agree_with_the_p4info():
    info = load_p4info()
    annotated = {}
    for name in ("softdta_tables.p4", "softdta_registers.p4"):
        for object_id, object_name in re.findall(r'@id\((0x[0-9a-f]+)\) @name\("\.(\w+)"\)', (P4 / name).read_text()):
            annotated[object_name] = int(object_id, 16)
    in_p4info = {o.preamble.name: o.preamble.id for o in list(info.tables) + list(info.actions) + list(info.registers)}
    assert annotated == in_p4info
    for table in info.tables:
        fields = {t.name: t for t in p4_control_tables()}[table.preamble.name].key
        assert [(m.name, m.bitwidth) for m in table.match_fields] == [(f.name, f.bits) for f in fields]
    shared = [name for name in CONFIG_TABLES if name not in P4_WITHOUT]
    assert [t.preamble.name for t in info.tables][:len(shared)] == shared


def test_shared_types_use_the_spec_layouts():
    types = header_fields("\n".join(read_generated().values()) + (P4 / "softdta_types.p4").read_text())
    for header in spec.DTA_HEADERS + spec.ROCE_HEADERS + (spec.ETHERNET, spec.IPV4, spec.UDP):
        assert {k: v for k, v in types[f"{header.name}_h"].items() if k != "_types"} == \
            {f.name: f.bits for f in header.fields}, header.name
    for table in p4_control_tables():
        assert {k: v for k, v in types[f"{table.name}_value_t"].items()} == {f.name: f.bits for f in table.value}


def tofino_includes() -> Path | None:
    candidates = [os.environ.get("SOFTDTA_TOFINO_INCLUDE", "")]
    for compiler in (shutil.which("p4test"), shutil.which("bf-p4c"), p4_tool("p4test")):
        if compiler:  # installed (share/p4c/p4include) or as built (p4include/tofino beside bin/)
            candidates += [str(Path(compiler).resolve().parent.parent / "share" / "p4c" / "p4include"),
                           str(Path(compiler).resolve().parent.parent / "p4include" / "tofino")]
    candidates += ["/usr/share/p4c/p4include", "/usr/local/share/p4c/p4include"]
    return next((Path(c) for c in candidates if c and (Path(c) / "tna.p4").is_file()), None)


# Warnings docs/p4.md justifies: the shared spec file defines every constant and register for both programs (and
# the BPF side), and a Sketch-Merge gather keeps its state in its own header, not in recirculated metadata.
JUSTIFIED_WARNINGS = (re.compile(r"warning: '?\S+'? is unused"), re.compile(r"warning: table '\S+' is unused"),
                      re.compile(r"warning: no user metadata fields tagged with @field_list"))


# TNA under p4test, also justified there: register actions read control-level operands the apply block sets
# before the stage that executes them, egress reads the bridge header ingress always adds, and the parsers
# leave the metadata to the controls. p4test cannot see any of the three.
REGISTER_ACTION_OPERANDS = ("batch", "pending", "stored_data", "postcard_key", "hop_bit", "hop_index", "encoded",
                            "fresh_entry", "complete_mask", "reporter_bit", "sketch_column", "everyone", "now", "tail",
                            "window_end", "reply_acks", "reply_resyncs")
JUSTIFIED_TNA_WARNINGS = JUSTIFIED_WARNINGS + (
    re.compile(rf"warning: ({'|'.join(REGISTER_ACTION_OPERANDS)}) may be uninitialized$"),
    re.compile(r"warning: accessing a field of a potentially invalid header hdr\.bridge$"),
    re.compile(r"warning: out parameter 'meta' may be uninitialized when 'Softdta(Ingress|Egress)Parser' terminates$"))


def unjustified_warnings(stderr: str, justified=JUSTIFIED_WARNINGS) -> list[str]:
    return [line for line in stderr.splitlines()
            if "warning" in line and not any(pattern.search(line) for pattern in justified)]


@pytest.mark.interop
def test_v1model_program_compiles_and_its_p4info_agrees(tmp_path):
    p4info = tmp_path / "softdta.p4info.txtpb"
    result = subprocess.run([p4_tool("p4c-bm2-ss"), "--std", "p4-16", "-I", str(P4),
                             "-o", str(tmp_path / "softdta.json"), "--p4runtime-files", str(p4info),
                             str(PROGRAMS["v1model"])],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert not unjustified_warnings(result.stderr)
    from softdta.targets.p4info import parse_p4info
    compiled = parse_p4info(p4info.read_text())
    ours = load_p4info()
    for kind in ("tables", "actions"):
        theirs = {o.preamble.name.lstrip("."): o.preamble.id for o in getattr(compiled, kind)}
        for item in getattr(ours, kind):
            assert theirs.get(item.preamble.name) == item.preamble.id, item.preamble.name


@pytest.mark.interop
def test_programs_pass_p4test():
    result = subprocess.run([p4_tool("p4test"), "--std", "p4-16", "-I", str(P4), str(PROGRAMS["v1model"])],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    includes = tofino_includes()
    if includes is None:
        pytest.skip("tna.p4 not found: set SOFTDTA_TOFINO_INCLUDE to the Tofino p4include directory")
    result = subprocess.run([p4_tool("p4test"), "--std", "p4-16", "-I", str(includes), "-I", str(P4),
                             "-D__TARGET_TOFINO__=1", str(PROGRAMS["tna"])], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert not unjustified_warnings(result.stderr, JUSTIFIED_TNA_WARNINGS)


@pytest.mark.parametrize("architecture", sorted(PROGRAMS))
def test_both_programs_resolve_the_fleet_address(architecture):
    """At the fleet address each program hashes the partition key with the spec's partition polynomial, looks its
    slot up and counts what it finds (tests/p4/test_bmv2_fleet.py runs the v1model one; p4test compiles both)."""
    program = strip(preprocessed(PROGRAMS[architecture].read_text()))
    for needed in ("fleet_config.apply()", "fleet_slot.apply()", "CNT_DROP_FLEET_UNMAPPED", "CNT_FLEET_RESOLVED",
                   "meta.tables.fleet_slot.has_structure"):
        assert needed in program, needed
    if architecture == "tna":
        assert re.search(r"CRCPolynomial<bit<32>>\(PARTITION_POLYNOMIAL, true, false, false, 32w0xFFFFFFFF, "
                         r"32w0xFFFFFFFF\) partition_poly;", program)
        assert len(re.findall(r"\bpartition_hash_unit\.get\(", program)) == 3  # Key-Write, Key-Increment, Postcarding
    else:
        assert program.count("hash(partition_hash, HashAlgorithm.crc32_custom") == 1  # softdta.targets.bmv2 sets it
