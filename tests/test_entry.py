"""Importing the packages changes nothing process-wide; the command lines prepare the process themselves."""

import json
import os

import helpers

# Variables the project sets for a command line: JAX's platform (platforms.skip_absent_tpu) and what the
# storage clients read once STORAGE_EMULATOR_HOST is set (storage.use_emulator).
OWN = ("JAX_PLATFORMS", "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")
CHANGED = """
import json, os, sys
import jax, orbax.checkpoint, wandb, fsspec  # their own import-time settings are theirs, not the project's
before = dict(os.environ)
{statements}
print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))
"""


def _changed_variables(statements: str) -> list:
    env = helpers.with_checkout({k: v for k, v in os.environ.items() if k not in OWN},
                                STORAGE_EMULATOR_HOST="http://127.0.0.1:9")
    done = helpers.run_python(CHANGED.format(statements=statements), env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [name for name, _ in json.loads(done.stdout.strip().splitlines()[-1])]


def test_importing_the_packages_leaves_the_environment_alone_and_the_command_lines_prepare_it():
    assert _changed_variables("import scaling, scaling.run.train, sweeps.launch") == []
    prepared = set(_changed_variables("from scaling.entry import prepare_process; prepare_process()"))
    assert {"TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING"} <= prepared <= set(OWN)
