"""The installed package works outside the checkout: the wheel carries the
grammar and templates, and a fresh virtual environment lints a plan from
another directory."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_installs_and_lints_elsewhere(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("dslc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "dslc/grammar/plan.lark" in names
    assert "dslc/docs/language.md" in names  # the hover of dslc lsp
    assert any(n.startswith("dslc/templates/") and n.endswith(".jinja") for n in names)

    # A fresh environment with the wheel installed; its dependencies come from
    # this environment's site-packages (a .pth line) so the test needs no network
    # and does not copy torch. The checkout is not on its path.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    fresh_site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(fresh_site)
    (fresh_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(ROOT / "tests" / "cases" / "zero_stage.plan", work / "bad.plan")
    shutil.copytree(ROOT / "plans", work / "plans")
    shutil.copytree(ROOT / "clusters", work / "clusters")
    probe = subprocess.run([str(py), "-c", "import dslc, sys; print(dslc.__file__)"], cwd=work, capture_output=True, text=True)
    assert probe.stdout.startswith(str(fresh_site)), probe

    ok = subprocess.run([str(py), "-m", "dslc", "lint", "plans"], cwd=work, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([str(py), "-m", "dslc", "lint", "bad.plan"], cwd=work, capture_output=True, text=True)
    assert bad.returncode == 1 and "bad.plan:" in bad.stdout and "E081" in bad.stdout
    docs = subprocess.run([str(py), "-c", "from dslc.lsp import keydocs; print(keydocs.markdown('train', 'steps'))"],
                          cwd=work, capture_output=True, text=True)
    assert "default: `100`" in docs.stdout, docs  # the docs inside the wheel, not the checkout's
