"""The wheel carries the BPF objects, built here with clang, and the P4 sources (softdta/kernel/resources.py): an
installed softdta loads its programs with no compiler present. Everything else is in pyproject.toml."""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("bpf_build", ROOT / "softdta" / "kernel" / "bpf_build.py")
bpf_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bpf_build)


class BuildWithData(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install is a checkout: it reads bpf/ and p4/ where they are
        data = Path(self.build_lib) / "softdta" / "_data"
        for folder, patterns in (("bpf", ("*.c", "*.h")), ("p4", ("*.p4", "*.txtpb"))):
            for pattern in patterns:
                for path in (ROOT / folder).rglob(pattern):
                    if "build" in path.relative_to(ROOT / folder).parts:
                        continue
                    copy = data / folder / path.relative_to(ROOT / folder)
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, copy)
        for name in bpf_build.SHIPPED:
            source = ROOT / "bpf" / name
            bpf_build.compile_bpf(source, data / "bpf" / bpf_build.object_name(source), ROOT / "bpf")


setup(cmdclass={"build_py": BuildWithData})
