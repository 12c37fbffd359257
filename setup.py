"""The compiled part of the build: the planes kernel ``shardsafe.format._planes``.

Everything else is declared in pyproject.toml. The extension is optional: where no C
compiler works, the build warns and the package installs without it, and
``format.codec`` runs the same transform in numpy (the same bytes, slower). On x86-64 the
kernel carries an AVX2 clone of each function beside the baseline one (GCC/Clang
``target_clones``, chosen at load time by the CPU); a compiler or C library without that
feature gets the baseline build only.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, LinkError

NO_CLONES = ("SHARDSAFE_NO_CLONES", "1")


class BuildKernel(build_ext):
    """``build_ext`` that retries the kernel without function clones before giving up."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, LinkError):  # one retry; then setuptools decides (optional)
            if NO_CLONES in ext.define_macros:
                raise
            self.warn(f"building {ext.name} with function clones failed; retrying without them")
            ext.define_macros.append(NO_CLONES)
            super().build_extension(ext)


setup(
    ext_modules=[Extension("shardsafe.format._planes", ["src/shardsafe/format/_planes.c"],
                           extra_compile_args=["-O3", "-std=c99"], optional=True)],
    cmdclass={"build_ext": BuildKernel},
)
