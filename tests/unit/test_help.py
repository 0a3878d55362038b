"""`softdta --help` and every command's --help, run as a user types them (the installed console script, in an
environment holding only PATH and HOME): each exits 0, and every command, option and argument they list says what
it does."""

import functools
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.common import ROOT

PLAIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENTRY_INDENTS = (2, 4)  # argparse's indentation of an option or argument, and of a sub-command under its group


@pytest.fixture(scope="module")
def help_of(tmp_path_factory):
    console_script = shutil.which("softdta")
    if not console_script:
        pytest.fail("the `softdta` console script is not on PATH: run `pip install -e .` (scripts/setup.sh does)")
    home = tmp_path_factory.mktemp("home")

    @functools.cache
    def run(*command: str) -> str:
        result = subprocess.run([console_script, *command, "--help"], cwd=ROOT, capture_output=True, text=True,
                                timeout=120, env={"PATH": PLAIN_PATH, "HOME": str(home)})
        assert result.returncode == 0, f"softdta {' '.join(command)} --help: exit {result.returncode}\n" \
                                       f"{result.stderr[-2000:]}"
        assert not result.stderr, result.stderr
        return result.stdout
    return run


def sub_commands(help_text: str) -> list[str]:
    """The sub-commands a usage offers: `{a,b,c} ...` (choices of an argument have no `...` after them)."""
    usage = " ".join(help_text.split("\n\n")[0].split())
    found = re.search(r"\{([a-z0-9,-]+)\} \.\.\.", usage)
    return found.group(1).split(",") if found else []


def indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def entries(help_text: str) -> list[tuple[str, str]]:
    """(name, help) of every option, argument and sub-command listed under a heading such as `options:`; the
    help is what follows the name on its line (after two spaces or more) and on the lines indented under it."""
    listed: list[tuple[str, str]] = []
    lines = help_text.splitlines()
    in_section = False
    for number, line in enumerate(lines):
        if line and not line[0].isspace():
            in_section = line.endswith(":") and not line.startswith("usage:")
            continue
        if not in_section or indent(line) not in ENTRY_INDENTS:
            continue
        name, *on_line = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        continued = []
        for following in lines[number + 1:]:
            if not following.strip() or indent(following) in ENTRY_INDENTS or not following[0].isspace():
                break
            continued.append(following.strip())
        listed.append((name, " ".join([*on_line, *continued])))
    return listed


def commands(help_of) -> list[tuple[tuple[str, ...], str]]:
    """Every command with its --help, `softdta` itself first; each level's run side by side (each takes seconds)."""
    found: list[tuple[tuple[str, ...], str]] = []
    level: list[tuple[str, ...]] = [()]
    with ThreadPoolExecutor(max_workers=8) as pool:
        while level:
            helps = list(zip(level, pool.map(lambda path: help_of(*path), level)))
            found += helps
            level = [(*path, name) for path, text in helps for name in sub_commands(text)]
    return found


def test_every_command_option_and_argument_says_what_it_does(help_of):
    every = commands(help_of)
    assert {"translate", "decode", "report", "translator", "collector", "query", "bench", "demo", "lab", "p4",
            "codegen"} <= {path[0] for path, _ in every if path}
    undocumented = []
    for path, text in every:
        listed = dict(entries(text))
        assert listed, f"softdta {' '.join(path)} --help lists no options"
        group = "{" + ",".join(sub_commands(text)) + "}"  # documented by the sub-commands listed under it
        undocumented += [f"softdta {' '.join(path)}: {name}" for name, says in listed.items()
                         if not says and name != group]
        undocumented += [f"softdta {' '.join(path)}: {name} (not listed)" for name in sub_commands(text)
                         if name not in listed]
        if path:
            description = text.split("\n\n")[1]
            assert not description.startswith(("options:", "positional arguments:")), \
                f"softdta {' '.join(path)} --help does not say what the command does"
    assert not undocumented, "no help for:\n" + "\n".join(undocumented)


def test_the_help_opens_with_what_softdta_does(help_of):
    description = " ".join(help_of().split("\n\n")[1].split())
    assert description.startswith("softdta turns the telemetry reports switches send"), description
    assert "dispatch" not in help_of()


def test_the_demo_help_gives_the_rates_the_demo_uses(help_of):
    from softdta.lab.demo import DEFAULT_RATE, DEFAULTS, PYTHON_ENGINE_RATE
    rate_help = dict(entries(help_of("demo")))["--rate RATE"]
    assert f"(default {DEFAULT_RATE:.0f}, rxe {DEFAULTS['rxe']['rate']:.0f}, --engine python " \
           f"{PYTHON_ENGINE_RATE:.0f})" in rate_help, rate_help
