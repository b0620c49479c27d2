"""The rollout engine: kernels behind one interface, their fast products, and the planner.

- `kernel`: `AbstractKernel`, what the engine needs of a kernel type and what
  else a type declares it can do, and `register_kernel`, the registry's one call;
- `alibi`, `dense`, `offset`: the kernel types (ALiBi + content with its dense
  reference, measured dense, relative-position), each registered at its bottom;
- `config`: what the kernel types' YAML forms share (nested lists, the npz beside the file);
- `structured*`: the O(H N) ALiBi products, their adjoint and the shared dense kernel;
- `relative`: the FFT products of relative-position kernels;
- `plan`: `plan(model, n, method)`, the one place a path is chosen;
- `step`: the layer step ``(1 - lambda) v + lambda v^T A``, written once.
- `probability`: the probability path, a kernel type extended by the gradient through the softmax
  (`with_probability_path`; the kernel then takes the layer step, `AbstractKernel.step`).

`jaxroll.rollout` runs the scans; users reach kernels through `jaxroll.kernel_types`.
"""
