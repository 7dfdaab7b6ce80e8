"""The light modules stay light: the space, costs and CLI import without torch or Ray."""

from __future__ import annotations

import subprocess
import sys


def test_space_and_cli_import_without_torch_or_ray():
    code = (
        "import sys, archsearch.space, archsearch.cli; "
        "heavy = sorted({'torch', 'ray', 'optuna'} & set(sys.modules)); "
        "print(','.join(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
