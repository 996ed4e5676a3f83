# SPDX-License-Identifier: MIT
"""Installs alibi_torch: `pip install --no-build-isolation ./python` from alibi's source tree.

The operator library is built by alibi's own CMake project (target alibi_torch_ops, the kernels
with their instruction-set dispatch) and copied into the package. Needs what
`ALIBI_WITH_TORCH=1 scripts/install-deps.sh` installs: CMake, a C++17 compiler, Eigen, and
Debian's python3-torch and libtorch-dev; nothing is downloaded. torch is not declared as a
requirement because Debian's python3-torch carries no pip metadata: pip would try to fetch it.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.abspath(os.path.join(self.build_temp, "alibi-cmake"))
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DALIBI_TORCH=ON",
                     "-DALIBI_BUILD_TESTS=OFF", "-DALIBI_BUILD_EXAMPLES=OFF", "-DALIBI_BUILD_BENCHMARKS=OFF",
                     "-DALIBI_BUILD_DOCS=OFF", "-DALIBI_INSTALL=OFF", "-DALIBI_CUDA=OFF", "-DALIBI_NATIVE=OFF",
                     f"-DALIBI_TORCH_PYTHON={sys.executable}"]
        # The instruction sets the kernels are compiled for (default: x86-64-v2, v3 and v4, chosen
        # at run time); one, e.g. x86-64-v3, builds three times faster.
        if os.environ.get("ALIBI_KERNELS_VARIANTS"):
            configure.append(f"-DALIBI_KERNELS_VARIANTS={os.environ['ALIBI_KERNELS_VARIANTS']}")
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        if shutil.which("ccache"):
            configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "alibi_torch_ops", "--parallel",
                               str(os.cpu_count() or 1)])
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(build_dir, "python", "_alibi_ops.so"), target)


setup(
    name="alibi-torch",
    version="0.1.0",
    description="ALiBi attention for PyTorch on alibi's fused CPU kernels (forward, backward, trainable slopes)",
    license="MIT",
    packages=["alibi_torch"],
    ext_modules=[Extension("alibi_torch._alibi_ops", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.8",
)
