"""Ship ``tl_query_lens-saelens.pth`` at the root of the wheel (setuptools has no declarative option for it).

The .pth file runs ``_tl_query_lens_saelens.install()`` at interpreter start, so SAELens finds this project's
architectures without ``import tl_query_lens``; see that module. Editable installs do not carry root files:
``scripts/setup.sh`` copies the .pth into site-packages for them.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "tl_query_lens-saelens.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, str(Path(self.build_lib) / PTH))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
