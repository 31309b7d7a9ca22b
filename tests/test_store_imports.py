"""The store knows nothing of HTTP: importing any of its modules loads neither Flask nor Werkzeug."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Run in a fresh interpreter: this one has long since imported Flask for other tests.
PROBE = """
import importlib, json, pkgutil, sys
import collector.store
names = ["collector.store"] + [f"collector.store.{m.name}" for m in pkgutil.iter_modules(collector.store.__path__)]
for name in names:
    importlib.import_module(name)
web = sorted(m for m in sys.modules if m.split(".")[0] in ("flask", "werkzeug"))
print(json.dumps({"imported": names, "web": web}))
"""


def test_no_store_module_loads_flask_or_werkzeug():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[1])
    found = json.loads(result.stdout)
    # The walk found the store's modules (an empty walk would pass vacuously).
    assert {"collector.store.jobs", "collector.store.identity", "collector.store.errors"} <= set(found["imported"])
    assert found["web"] == []
