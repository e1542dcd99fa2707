"""`pip install ./python` (offline, no build isolation): the installed package finds the op library
in moejit/lib/ and dynamo finds the backend through the torch_dynamo_backends entry point."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
import setuptools

import moejit

from conftest import ROOT


def _can_build_wheels() -> bool:
    # setuptools < 70.1 takes bdist_wheel from the `wheel` package.
    version = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
    return version >= (70, 1) or importlib.util.find_spec("wheel") is not None


pytestmark = pytest.mark.skipif(not _can_build_wheels(),
                                reason="pip cannot build a wheel here: install `wheel` or setuptools>=70.1")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pkg")
    src, site = tmp / "src", tmp / "site"
    shutil.copytree(ROOT / "python", src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "lib"))
    library = moejit.library_path() or moejit._ops.find_library()
    (src / "moejit" / "lib").mkdir()
    shutil.copy2(library, src / "moejit" / "lib" / "libmoejit_torch.so")  # what scripts/build.sh does
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                    "--target", str(site), str(src)], check=True, cwd=tmp)
    return site


def _run(site, code):
    env = dict(os.environ, PYTHONPATH=str(site))
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=site.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_installed_package_loads_its_own_library(installed):
    out = _run(installed, "import moejit; print(moejit.library_path()); print(moejit.__file__)")
    library, package = out.split()
    assert library == str(installed / "moejit" / "lib" / "libmoejit_torch.so")
    assert package.startswith(str(installed))


def test_entry_point_backend_before_import(installed):
    _run(installed, "import torch, torch._dynamo\n"
                    "fn = torch._dynamo.lookup_backend('moejit')\n"
                    "import moejit.dynamo\n"
                    "assert fn is moejit.dynamo.moejit_backend, fn\n")


def test_entry_point_backend_after_import(installed):
    _run(installed, "import moejit, torch, torch._dynamo\n"
                    "assert 'moejit' in torch._dynamo.list_backends()\n"
                    "assert torch._dynamo.lookup_backend('moejit') is moejit.dynamo.moejit_backend\n"
                    "f = torch.compile(lambda x: x * 2, backend='moejit')\n"
                    "assert f(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]\n")
