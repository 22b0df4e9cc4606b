"""librdkafka's own integration suite, its quick set, against a `strata dev` node.

scripts/librdkafka-suite.sh fetches librdkafka's source from crates.io (the rdkafka-sys crate),
builds its test runner once (cached in target/librdkafka-suite/), starts Strata and runs the
broker tests of tests/librdkafka/suite_sets.py's QUICK list. The full run and its latest table
are in docs/kafka-compatibility.md ("librdkafka's integration suite").
"""

import os
import subprocess
import sys

from conftest import REPO, strata_bin

# The build from nothing takes about two minutes on two cores, the quick set a few more.
TIMEOUT_S = 1800


def test_librdkafka_quick_set(capsys):
    env = dict(os.environ, STRATA_BIN=strata_bin())
    env.setdefault("STRATA_TEST_VENV", str(REPO / ".venv"))
    env.setdefault("LRK_SHIM_PYTHON", sys.executable)
    r = subprocess.run([str(REPO / "scripts" / "librdkafka-suite.sh"), "--set", "quick"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    out = r.stdout + r.stderr
    # The suite writes a lot through its node: let the kernel write it back now, not during
    # the timing-sensitive tests that run next (test_limits saw 20 s stalls after it).
    os.sync()
    with capsys.disabled():
        # the table, whether it passed or not
        start = out.find("librdkafka 2.")
        print("\n" + (out[start:] if start >= 0 else out))
    assert r.returncode == 0, f"librdkafka's quick set failed (exit {r.returncode}):\n{out}"
    assert "totals: " in out and " pass " in out, out
