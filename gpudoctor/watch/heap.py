"""The watch process's heap once it has started: what the start made is set aside from the cyclic garbage
collector, which otherwise walks all of it again at every full collection, for as long as the watch runs."""

from __future__ import annotations

import gc


def settle() -> None:
    """Collect what the start left behind, then move every object still alive out of the collector's
    generations (`gc.freeze`, Python's gc docs). Modules, classes, the session and the dashboard's widgets
    live as long as the watch: at 128 GPUs the dashboard holds ~110,000 objects after its first frame, and
    the collections walking them were ~15% of its main thread (`gc.callbacks`, thread time, 30 s in a pty:
    78-90 ms of GC against 33-37 ms with them frozen). Frozen objects freed by reference count still are;
    only a cycle among them would never be collected (the start leaves none: collected first). Called by
    the `watch` command alone: a test process that imports these modules keeps its collector as it is."""
    gc.collect()
    gc.freeze()
