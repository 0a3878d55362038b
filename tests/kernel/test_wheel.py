"""A package that installs: the wheel, built as a user builds it, goes into a fresh virtual environment with no
clang on PATH, and the XDP differential test runs from the installed package, which loads the BPF objects the
wheel ships (softdta/kernel/resources.py)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.common import ROOT

pytestmark = [pytest.mark.privileged, pytest.mark.slow]


def run(command: list, **options) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=900, **options)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def test_the_wheel_runs_the_xdp_translator_without_clang(tmp_path):
    run([sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "-q", "-w", tmp_path / "dist"])
    wheel = next((tmp_path / "dist").glob("softdta-*.whl"))
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, "pytest"])

    # The differential test, away from the checkout: its helpers and the example tables, and nothing else.
    project = tmp_path / "project"
    (project / "tests" / "kernel").mkdir(parents=True)
    for name in ("common.py", "conftest.py", "kernel/test_xdp_translator.py"):
        shutil.copy(ROOT / "tests" / name, project / "tests" / name)
    shutil.copy(ROOT / "conftest.py", project / "conftest.py")
    shutil.copytree(ROOT / "examples", project / "examples")
    environment = {"PATH": str(venv / "bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    where = run([python, "-c", "import shutil, softdta.kernel.programs as x; "
                                "print(x.__file__, x.INSTALLED, shutil.which('clang'))"],
                env=environment, cwd=project).stdout.split()
    assert Path(where[0]).is_relative_to(venv) and where[1:] == ["True", "None"], where
    result = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernel/test_xdp_translator.py", "-k",
                  "random_reports_match or every_frame_the_kernel_emits"], env=environment, cwd=project)
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
