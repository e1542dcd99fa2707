# The hostile-invocation fuzzer (tests/fuzz/hostile_cli.py, issue 22) against the built `moejit`:
# no crash, no hang, exit 0 or 2, one short line naming the field. Bounded for CI (about 1000
# invocations, under a minute); MOEJIT_FUZZ_ITERATIONS runs more, MOEJIT_FUZZ_SEED other draws.
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fuzz"))
import hostile_cli  # noqa: E402


def test_hostile_invocations_are_refused_cleanly(moejit_cli, tmp_path):
    iterations = int(os.environ.get("MOEJIT_FUZZ_ITERATIONS", "1000"))
    seed = int(os.environ.get("MOEJIT_FUZZ_SEED", "20261203"))
    failures = hostile_cli.run(moejit_cli, iterations, seed, keep_dir=tmp_path / "failing-inputs")
    assert not failures, f"{len(failures)} of {iterations} hostile invocations misbehaved:\n" + "\n".join(failures[:20])
