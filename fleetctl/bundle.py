"""The host program as one payload: :mod:`fleetctl.host` and :mod:`fleetctl.protocol` in memory.

Nothing is installed on a host. Each run sends one program over stdin (read and executed by
:data:`BOOTSTRAP`, which never changes, so a sudoers rule naming it keeps working): a short
loader holding the source of every module of the host package and of the protocol module. The
loader puts an importer over those sources first on ``sys.meta_path`` and runs
:func:`fleetctl.host.main.run`; whatever ``fleetctl`` the host might have installed is never
imported. The same modules are imported normally by the client and by tests.
"""

from __future__ import annotations

import functools
from importlib import resources

# Reads the host-side program from stdin and runs it, so nothing is installed on the host and no
# data ever appears on a command line. docs/inventory.md quotes it for sudoers: keep it as is.
BOOTSTRAP = (
    "import sys;n=int(sys.stdin.buffer.readline());"
    "exec(compile(sys.stdin.buffer.read(n),'fleetctl-hostside','exec'),{'__name__':'__main__'})"
)

# Runs on the host's Python 3.8+: an importer over SOURCES (module name -> (is package, source)).
_LOADER = '''\
import importlib.util
import sys


class _FromMemory(object):
    """Finds and loads the modules of SOURCES, and only those."""

    def find_spec(self, name, path=None, target=None):
        if name not in SOURCES:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=SOURCES[name][0])

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        source = SOURCES[module.__name__][1]
        where = "<fleetctl>/" + module.__name__.replace(".", "/") + ".py"
        exec(compile(source, where, "exec"), module.__dict__)


sys.meta_path.insert(0, _FromMemory())
from fleetctl.host.main import run  # noqa: E402

sys.exit(run())
'''

#: The packages of the program; every ``.py`` file in them is sent.
PACKAGES = ("fleetctl.host",)
#: Single modules sent besides the packages.
MODULES = ("fleetctl.protocol",)


def host_sources() -> dict[str, tuple[bool, str]]:
    """Module name -> (is a package, source text) of everything the host program imports.

    ``fleetctl`` itself is sent as an empty package: its real ``__init__`` is the client's.
    Sorted by name, so the payload is the same bytes on every run.
    """
    sources: dict[str, tuple[bool, str]] = {"fleetctl": (True, "")}
    for package in PACKAGES:
        folder = resources.files(package)
        for item in folder.iterdir():
            if not item.name.endswith(".py"):
                continue
            stem = item.name[:-3]
            name = package if stem == "__init__" else f"{package}.{stem}"
            sources[name] = (stem == "__init__", item.read_text(encoding="utf-8"))
    for module in MODULES:
        package, _, stem = module.rpartition(".")
        sources[module] = (False, resources.files(package).joinpath(f"{stem}.py")
                           .read_text(encoding="utf-8"))
    return dict(sorted(sources.items()))


@functools.cache
def program() -> bytes:
    """The program :data:`BOOTSTRAP` executes on the host (built once per process).

    Its size is about that of the sources it holds (~100 KiB); it is one frame on stdin.
    """
    sources = "SOURCES = {\n" + "".join(
        f"    {name!r}: ({is_package!r}, {source!r}),\n"
        for name, (is_package, source) in host_sources().items()) + "}\n\n"
    return (sources + _LOADER).encode("utf-8")
