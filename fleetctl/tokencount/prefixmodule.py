"""Loading the blueprint's runner prefix builder (``runner/fleet_runner/prefix.py``).

fleetctl and the runner build the prompt prefix with the same code (docs/invariants.md, invariant
9): fleetctl imports the blueprint's own builder from its file, once per content, instead of a
copy of it.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from types import ModuleType

from fleetctl.errors import InputError

_MODULES: dict[str, ModuleType] = {}


def load_prefix_module(blueprint: Path) -> ModuleType:
    """Import ``<blueprint>/runner/fleet_runner/prefix.py`` (once per content).

    Raises:
        InputError: the file is missing or does not import.
    """
    path = Path(blueprint) / "runner" / "fleet_runner" / "prefix.py"
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the runner's prefix builder: {exc.strerror}",
                         hint="fleetctl tokens measures the prefix with the blueprint's runner") \
            from None
    name = "_fleetctl_prefix_" + hashlib.sha256(source).hexdigest()[:16]
    if name not in _MODULES:
        # Run from the bytes just read and hashed, with no loader that writes bytecode: a
        # __pycache__ left in the blueprint would be an untracked file (a dirty source for ship)
        # or, shipped with --allow-dirty, drift on every host.
        module = ModuleType(name)
        module.__file__ = str(path)
        sys.modules[name] = module  # dataclasses look their module up while the class is made
        try:
            exec(compile(source, str(path), "exec"), module.__dict__)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise InputError(f"{path}: the runner's prefix builder does not import: "
                             f"{type(exc).__name__}: {exc}") from None
        _MODULES[name] = module
    return _MODULES[name]
