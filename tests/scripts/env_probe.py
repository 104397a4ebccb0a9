"""A user's script that checks, without printing them, that secrets reached its rank's environment.

    torchrun ... env_probe.py NAME=SHA256 ...   exits 1 naming the first variable that is missing or differs
"""

import hashlib
import os
import sys

for arg in sys.argv[1:]:
    name, digest = arg.split("=", 1)
    value = os.environ.get(name)
    if value is None or hashlib.sha256(value.encode()).hexdigest() != digest:
        sys.exit(f"rank {os.environ.get('RANK')}: {name} is {'missing' if value is None else 'not the value given'}")
print(f"secrets ok on rank {os.environ.get('RANK')} ({len(sys.argv) - 1} variables)", flush=True)
