"""A subprocess for tests/test_cache.py and tests/test_bucket.py: the `jaxroll`
command with JAX's compilation events counted.

``python tests/cache_worker.py ARGS...`` runs ``jaxroll ARGS...`` exactly as
the command line does (``main()`` with sys.argv, so the persistent cache is
on as for a user), then prints one last line of JSON: how many programs XLA
compiled (``compiles``: the backend-compile events, which a cache hit skips),
and the cache's hits and misses (jax.monitoring events).
"""

import collections
import json
import sys

import jax

events = collections.Counter()
jax.monitoring.register_event_listener(lambda event, **_: events.update([event]))
jax.monitoring.register_event_duration_secs_listener(lambda event, duration, **_: events.update([event]))

from jaxroll.cli import main  # noqa: E402

sys.argv = ["jaxroll", *sys.argv[1:]]
status = main()
print(json.dumps({"status": status, "events": dict(events)}))
sys.exit(status)
