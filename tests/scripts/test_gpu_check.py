"""scripts/gpu_check.sh --dry-run on this CPU box with a local FAKE bundle (no network): the env stage runs,
the wheels stage verifies the manifest and installs offline into OUT/site, a cp312 binary is only checked,
the GPU stages are printed as skipped; a tampered bundle fails the wheels stage."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _wheel(directory: Path, dist: str, version: str, tag: str, module: str, body: str) -> Path:
    """A minimal valid wheel (module + dist-info with METADATA, WHEEL, RECORD)."""
    path = directory / f"{dist}-{version}-{tag}.whl"
    info = f"{dist}-{version}.dist-info"
    files = {f"{module}.py": body,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _bundle(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    pure = _wheel(bundle, "replayssm_fake_dep", "0.1", "py3-none-any", "replayssm_fake_dep", "VALUE = 42\n")
    binary = _wheel(bundle, "replayssm_fake_ext", "0.1", "cp312-cp312-manylinux_2_17_x86_64", "replayssm_fake_ext",
                    "VALUE = 1\n")
    lines = ["# fake bundle", "name\tversion\tsha256\tsize\tfile"]
    for whl in (pure, binary):
        data = whl.read_bytes()
        lines.append(f"{whl.name.split('-')[0]}\t0.1\t{hashlib.sha256(data).hexdigest()}\t{len(data)}\t{whl.name}")
    (bundle / "MANIFEST.tsv").write_text("\n".join(lines) + "\n")
    return bundle


def _run(out: Path, bundle: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PY=sys.executable, WHEELS=str(bundle), STAGES="env wheels tests", T_ENV="60")
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)


@pytest.mark.skipif(sys.version_info[:2] == (3, 12), reason="the fake cp312 wheel would be installable here")
def test_dry_run_installs_the_bundle_offline_and_prints_the_gpu_commands(tmp_path):
    out = tmp_path / "out"
    proc = _run(out, _bundle(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    stages = dict(line.split("\t")[:2] for line in (out / "stages.tsv").read_text().splitlines()[1:])
    assert stages == {"env": "ok", "wheels": "ok", "tests": "skipped-gpu"}
    assert (out / "env.json").is_file()
    assert (out / "site" / "replayssm_fake_dep.py").is_file()               # the pure wheel: installed
    assert not (out / "site" / "replayssm_fake_ext.py").exists()            # the cp312 binary: checked only
    assert "checked only (cp312 binary" in proc.stdout
    assert "GPU commands skipped here" in proc.stdout and "REPLAYSSM_TEST_DEVICE=cuda" in proc.stdout


def test_a_tampered_bundle_fails_the_wheels_stage(tmp_path):
    bundle = _bundle(tmp_path)
    whl = next(bundle.glob("replayssm_fake_dep-*.whl"))
    whl.write_bytes(whl.read_bytes() + b"\0")                                # size and sha256 now differ
    out = tmp_path / "out"
    proc = _run(out, bundle)
    assert proc.returncode == 1
    assert "wheels\tfailed" in (out / "stages.tsv").read_text()
    assert "size/sha256 differ" in proc.stdout and not (out / "site").exists()


def test_usage_error_without_out_dir():
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "usage" in proc.stderr
