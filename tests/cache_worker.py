"""A subprocess for tests/test_cache.py and tests/test_bucket.py: the `jaxroll`
command with JAX's compilation events counted.

``python tests/cache_worker.py ARGS...`` runs ``jaxroll ARGS...`` exactly as
the command line does (``main()`` with sys.argv, so the persistent cache is
on as for a user), then prints one last line of JSON: how many programs XLA
compiled and looked up (``events``: jax.monitoring's counts, e.g. the
cache's hits and misses) and the seconds of each timed event (``seconds``:
tracing, lowering, compiling or loading from the cache).
"""

import collections
import json
import sys

import jax

events = collections.Counter()
seconds = collections.Counter()


def _duration(event, duration, **_):
    events.update([event])
    seconds[event] += duration


jax.monitoring.register_event_listener(lambda event, **_: events.update([event]))
jax.monitoring.register_event_duration_secs_listener(_duration)

from jaxroll.cli import main  # noqa: E402

sys.argv = ["jaxroll", *sys.argv[1:]]
status = main()
print(json.dumps({"status": status, "events": dict(events), "seconds": dict(seconds)}))
sys.exit(status)
