"""A subprocess for tests/test_sweep.py: sweeps on fake CPU devices and on two processes.

XLA_FLAGS must name the device count before JAX initialises, which the test
suite's own process has already done; hence a fresh interpreter.

    python sweep_worker.py devices OUT.json
    python sweep_worker.py multihost PROCESS_ID PORT OUT.npz
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count="
                           + ("4" if sys.argv[1] == "devices" else "2"))

import importlib  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402

import jaxroll  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from sweep_models import content_model, uniform_model  # noqa: E402

sweep_module = importlib.import_module("jaxroll.sweeps.evaluate")


def devices(out):
    results = {"device_count": jax.device_count()}
    for name, model, axes in [
        ("vmap", content_model(), {"temperature": [0.5, 1.0, 2.0], "slope_scale": [0.5, 2.0]}),
        ("krylov", uniform_model(), {"lambda_0": [0.2, 0.5, 0.9], "beta": [0.5, 1.5]}),
    ]:
        single = jaxroll.sweep(model, **axes, lengths=[7, 24], mesh=1, progress=False)
        sharded = jaxroll.sweep(model, **axes, lengths=[7, 24], batch_size=4, progress=False)
        compiled = {f: getattr(sweep_module, f)._cache_size() for f in ("_vmapped_profiles", "_combine", "_krylov")}
        moved = {key: [v * 1.1 for v in values] for key, values in axes.items()}
        jaxroll.sweep(model, **moved, lengths=[7, 24], batch_size=4, progress=False)
        again = {f: getattr(sweep_module, f)._cache_size() for f in compiled}
        results[name] = {
            "method": sharded.method,
            "difference": float(np.max(np.abs(single.profiles - sharded.profiles))),
            "spec_is_batch": sharded.sharding.spec == PartitionSpec("batch"),
            "equivalent": sharded.sharding.is_equivalent_to(
                NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch")), 3),
            "mesh_devices": int(sharded.sharding.mesh.devices.size),
            "mesh_axes": list(sharded.sharding.mesh.axis_names),
            "recompiled": {f: again[f] - compiled[f] for f in compiled},
        }
    results["meshes"] = meshes()
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(results, handle)


def meshes():
    """Meshes built the standard ways (issue 19): each sweep's largest difference from one device, or its error."""
    from jax.sharding import AxisType

    builders = {
        "make_mesh": lambda: jax.make_mesh((4,), ("batch",)),  # Explicit axes on current JAX
        "make_mesh_auto": lambda: jax.make_mesh((4,), ("batch",), axis_types=(AxisType.Auto,)),
        "make_mesh_2d": lambda: jax.make_mesh((2, 2), ("data", "model")),
        "Mesh": lambda: Mesh(np.array(jax.devices()), ("x",)),
    }
    cases = [("vmap", content_model(), {"temperature": [0.5, 1.0, 2.0]}),
             ("krylov", uniform_model(), {"lambda_0": [0.2, 0.9], "beta": [0.5, 1.5]})]
    single = {kind: jaxroll.sweep(model, **axes, lengths=[7, 24], mesh=1, progress=False).profiles
              for kind, model, axes in cases}
    found = {}

    def attempt(label, kind, model, axes, **options):
        try:
            result = jaxroll.sweep(model, **axes, lengths=[7, 24], progress=False, **options)
            found[label] = {"difference": float(np.max(np.abs(result.profiles - single[kind]))),
                            "devices": int(result.sharding.mesh.devices.size), "method": result.method}
        except Exception as error:  # reported, not raised: the test names every failing mesh
            found[label] = {"error": f"{type(error).__name__}: {error}"[:300]}

    for name, build in builders.items():
        for kind, model, axes in cases:
            attempt(f"{name}/{kind}", kind, model, axes, mesh=build())
    for kind, model, axes in cases:  # mesh=None under an ambient jax.set_mesh: that mesh
        with jax.set_mesh(builders["make_mesh"]()):
            attempt(f"set_mesh/{kind}", kind, model, axes)
    return found


def multihost(process_id, port, out):
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process_id, initialization_timeout=60)
    assert jax.process_count() == 2 and jax.device_count() == 4, (jax.process_count(), jax.device_count())
    vmapped = jaxroll.sweep(content_model(), temperature=[0.5, 1.0, 2.0], slope_scale=[0.5, 2.0],
                            lengths=[7, 24], progress=False)
    krylov = jaxroll.sweep(uniform_model(), lambda_0=[0.2, 0.5, 0.9], beta=[0.5, 1.5], progress=False)
    if jax.process_index() == 0:  # results are gathered to every process; process 0 writes
        np.savez(out, vmap=vmapped.profiles, krylov=krylov.profiles,
                 devices=vmapped.sharding.mesh.devices.size, processes=jax.process_count())
    jax.distributed.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "devices":
        devices(sys.argv[2])
    else:
        multihost(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
