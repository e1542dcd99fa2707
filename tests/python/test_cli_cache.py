# `moejit cache verify` and `moejit cache prune` on a real cache (a preset compiled for sm_90a
# here, no GPU): verify names each bad or refused entry with why and exits 1; prune empties the
# quarantine.
import os
import pathlib
import subprocess

import pytest


def run_cli(cli, root, *args):
    env = dict(os.environ, MOEJIT_CACHE_DIR=str(root))
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


def entries(root):
    return sorted(p for p in pathlib.Path(root, "v1", "sm_90a").glob("*/*") if p.is_dir())


def test_verify_says_why_and_prune_empties_the_quarantine(moejit_cli, tmp_path):
    root = tmp_path / "cache"
    built = run_cli(moejit_cli, root, "compile", "--preset", "deepseek-v2-lite", "--arch", "sm_90a")
    assert built.returncode == 0, built.stdout + built.stderr
    found = entries(root)
    assert len(found) >= 3, found
    flipped, refused = found[0], found[1]
    cubin = bytearray((flipped / "kernel.cubin").read_bytes())
    cubin[len(cubin) // 2] ^= 1
    (flipped / "kernel.cubin").write_bytes(bytes(cubin))
    refused.chmod(0o777)

    report = run_cli(moejit_cli, root, "cache", "verify")
    assert report.returncode == 1, report.stdout + report.stderr
    lines = report.stdout.splitlines()
    assert lines[0] == f"checked {len(found)} entries, 1 bad, 1 refused", report.stdout
    bad = [line for line in lines if line.startswith("quarantined: ")]
    assert len(bad) == 1 and bad[0].startswith(f"quarantined: {flipped}: ") and "kernel.cubin" in bad[0], lines
    left = [line for line in lines if line.startswith("refused ")]
    assert len(left) == 1 and f": {refused}: " in left[0] and "writable by group or others" in left[0], lines
    assert refused.is_dir() and not flipped.exists()
    quarantine = root / "v1" / "quarantine"
    assert len(list(quarantine.iterdir())) == 1

    refused.chmod(0o700)
    pruned = run_cli(moejit_cli, root, "cache", "prune", "--max-size", "1G")
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert list(quarantine.iterdir()) == []
    again = run_cli(moejit_cli, root, "cache", "verify")
    assert again.returncode == 0 and again.stdout.startswith(f"checked {len(found) - 1} entries, 0 bad, 0 refused"), again.stdout


def test_compile_all_to_all_also_caches_the_exchange_unit(moejit_cli, tmp_path):
    """`moejit compile --all-to-all` builds expert parallel's exchange unit beside the layer's, so a
    layer created in all_to_all mode finds every binary; a second run is all cache hits."""
    root = tmp_path / "cache"
    args = ("compile", "--preset", "deepseek-v2-lite", "--ep-size", "4", "--arch", "sm_90a")
    plain = run_cli(moejit_cli, root, *args)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    before = len(entries(root))
    built = run_cli(moejit_cli, root, *args, "--all-to-all")
    assert built.returncode == 0, built.stdout + built.stderr
    assert len(entries(root)) == before + 1, built.stdout
    assert " exchange built " in built.stdout and "moejit_exchange_pack_" in built.stdout, built.stdout
    again = run_cli(moejit_cli, root, *args, "--all-to-all")
    assert again.returncode == 0 and " 0 built " in again.stdout, again.stdout
