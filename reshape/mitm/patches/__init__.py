"""Every change reshape makes to mitmproxy's internals, one module per patch.

Each patch says why hooks were not enough and which mitmproxy version it was checked on
(`base.CHECKED_ON`); it refuses, with a one-line error, to install on any other. A process
installs its patches once when it starts (reshape/app/runtime.py, `ProxyProcess.start`) and
removes them when it stops; tests install them with `Patches(...)` as a context manager.
A patch reports what it sees through a callable the feature's addon provides (its type is named
in the patch module), never by importing the addon.
"""

from reshape.mitm.patches.base import CHECKED_ON, Patch, PatchError, Patches

__all__ = ["CHECKED_ON", "Patch", "PatchError", "Patches"]
