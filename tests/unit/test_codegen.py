import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from softdta import spec
from softdta.codegen.generate import BANNER, GENERATED, headers, stale, wire_members
from softdta.wire.codec import codec
from tests.common import p4_tool

ROOT = Path(__file__).resolve().parents[2]
C_HEADER = ROOT / "bpf" / "include" / "softdta_spec.h"
P4_FILE = ROOT / "p4" / "softdta_spec.p4"

# Included after the generated header to prove it does not collide with the UAPI headers a BPF program uses.
UAPI_INCLUDES = ["linux/if_ether.h", "linux/in.h", "linux/ip.h", "linux/ipv6.h", "linux/udp.h", "linux/bpf.h"]


def test_generated_files_are_up_to_date():
    outdated = stale(ROOT)
    names = [str(path.relative_to(ROOT)) for path in outdated]
    assert not outdated, f"{names} differ from what softdta/spec/ generates: run `softdta codegen`"


def test_every_p4_definition_is_generated():
    generated = {str(path) for path in GENERATED}
    assert {"p4/softdta_spec.p4", "p4/softdta_tables.p4", "p4/softdta_registers.p4", "p4/softdta_tna_unrolled.p4",
            "p4/softdta.p4info.txtpb"} <= generated
    # every P4 file that says it is generated is one `softdta codegen` writes (and `--check` checks)
    marked = {str(path.relative_to(ROOT)) for path in (ROOT / "p4").rglob("*.p4") if BANNER in path.read_text()}
    assert marked == {name for name in generated if name.endswith(".p4")}


def spec_checks_program(body: str) -> str:
    """A C unit that includes the generated header and the UAPI headers and checks sizes and shared constants."""
    checks = [f"_Static_assert(sizeof(struct {h.name}) == {h.size}, \"{h.name}\");" for h in headers()]
    checks += [f"_Static_assert({name} == {getattr(spec, name)}, \"{name}\");"
               for name in ("ETH_P_IP", "ETH_P_IPV6", "IPPROTO_UDP")]
    includes = ['#include "softdta_spec.h"'] + [f"#include <{name}>" for name in UAPI_INCLUDES]
    return "\n".join(includes + checks + [body]) + "\n"


def test_c_header_compiles_with_gcc(tmp_path):
    source = tmp_path / "check.c"
    source.write_text(spec_checks_program("int main(void) { return BTH_SIZE + DTA_BASE_EXT_SIZE - 16; }"))
    result = subprocess.run(["gcc", "-fsyntax-only", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                             f"-I{C_HEADER.parent}", "-x", "c", str(source)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("clang") is None,
                    reason="clang not installed: BPF-target compile of the header not checked")
def test_c_header_compiles_for_bpf(tmp_path):
    source = tmp_path / "prog.c"
    source.write_text(spec_checks_program("""
__attribute__((section("xdp"), used)) int ack_req(struct xdp_md *ctx)
{
	struct bth *bth = (void *)(long)ctx->data;

	if ((void *)(bth + 1) > (void *)(long)ctx->data_end)
		return 0;
	return (bth->ack_req_reserved7 & BTH_ACK_REQ_MASK) >> BTH_ACK_REQ_SHIFT;
}
"""))
    # clang -target bpf does not search the host's multiarch directory, where <asm/types.h> lives.
    multiarch = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True).stdout.strip()
    result = subprocess.run(["clang", "-target", "bpf", "-O2", "-Wall", "-Werror", f"-I{C_HEADER.parent}",
                             f"-I/usr/include/{multiarch}", "-c", str(source), "-o", str(tmp_path / "prog.o")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def c_read_expressions(header: spec.Header) -> dict[str, str]:
    """C expressions reading each field of `struct <header> h` through members and MASK/SHIFT macros."""
    by_name = {f.name: f for f in header.fields}
    expressions = {}
    for member in wire_members(header):
        scalar = f"be{member.ctype[4:]}toh(h.{member.name})" if member.ctype.startswith("__be") else f"h.{member.name}"
        if member.bitfields:
            for field, _ in member.bitfields:
                macro = f"{header.name.upper()}_{field.name.upper()}"
                expressions[field.name] = f"(({scalar} & {macro}_MASK) >> {macro}_SHIFT)"
        elif member.length:
            if isinstance(by_name[member.name], spec.Raw):
                expressions[member.name] = None  # printed as hex bytes
            else:
                expressions[member.name] = " | ".join(
                    f"((unsigned long long)h.{member.name}[{i}] << {8 * (member.length - 1 - i)})"
                    for i in range(member.length))
        else:
            expressions[member.name] = scalar
    return expressions


@pytest.mark.parametrize("header", [spec.BTH, spec.DTA_BASE_EXT, spec.IPV4, spec.IPV6], ids=lambda h: h.name)
def test_c_layout_matches_codec_bit_for_bit(header, tmp_path):
    rng = random.Random(header.name)
    samples = [{f.name: rng.randbytes(f.size) if isinstance(f, spec.Raw) else rng.randrange(1 << f.bits)
                for f in header.fields} for _ in range(32)]
    packed = [codec(header).pack(sample) for sample in samples]
    expressions = c_read_expressions(header)
    prints = []
    for name, expression in expressions.items():
        if expression is None:
            size = next(f.size for f in header.fields if f.name == name)
            prints.append(f'printf("{name}="); for (int j = 0; j < {size}; j++) printf("%02x", h.{name}[j]); '
                          'printf("\\n");')
        else:
            prints.append(f'printf("{name}=%llu\\n", (unsigned long long)({expression}));')
    rows = ",\n".join("{" + ", ".join(str(b) for b in frame) + "}" for frame in packed)
    source = tmp_path / "bits.c"
    source.write_text(f"""#include <endian.h>
#include <stdio.h>
#include <string.h>
#include "softdta_spec.h"

static const unsigned char frames[][{header.size}] = {{
{rows}
}};

int main(void)
{{
	for (unsigned i = 0; i < sizeof(frames) / sizeof(frames[0]); i++) {{
		struct {header.name} h;
		memcpy(&h, frames[i], sizeof(h));
		{chr(10).join(prints)}
	}}
	return 0;
}}
""")
    binary = tmp_path / "bits"
    build = subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Werror", f"-I{C_HEADER.parent}", str(source),
                            "-o", str(binary)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    output = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.splitlines()
    expected = [f"{name}={sample[name].hex() if isinstance(sample[name], bytes) else sample[name]}"
                for sample in samples for name in expressions]
    assert output == expected


def p4_headers(text: str) -> dict[str, list[tuple[str, int]]]:
    return {name: [(field, int(bits)) for bits, field in re.findall(r"^\s*bit<(\d+)> (\w+);", body, re.M)]
            for name, body in re.findall(r"^header (\w+)_h \{\n(.*?)^\}", text, re.M | re.S)}


def test_p4_headers_match_spec():
    parsed = p4_headers(P4_FILE.read_text())
    for header in spec.DTA_HEADERS + spec.ROCE_HEADERS:
        fields = parsed[header.name]
        assert [name for name, _ in fields] == [f.name for f in header.fields], header.name
        assert sum(bits for _, bits in fields) == header.size * 8, header.name


def test_p4_compiles(tmp_path):
    result = subprocess.run([p4_tool("p4test"), "--std", "p4-16", str(P4_FILE)], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
