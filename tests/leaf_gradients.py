"""The gradient share of each block from leaf perturbations: an oracle for `lambda_gradient`, written for the tests.

Plain autograd on added zero leaves, no tensor hooks: it shares no code with
`jaxroll.measure.refinements`. Needs torch (imported by the caller's tests).
"""

import numpy as np


def leaf_gradient_share(model, ids, blocks, attention_outputs):
    """``lambda_gradient_t = 1 - sum_j ||g_a(j)|| / sum_j ||g_x(j)||`` per block, float64 NumPy ``(T,)``.

    A zero leaf ``d_x`` is added to every block's input and ``d_a`` to the
    output of each module in `attention_outputs` (the attention's output
    projection, or the norm after it); ``g = d max softmax(logits[-1]) / d(leaf)``.
    `ids` has shape ``(1, n)``.
    """
    import torch

    from jaxroll.measure.precision import full_precision

    n, hidden = ids.shape[1], model.config.hidden_size
    d_x = [torch.zeros(1, n, hidden, dtype=torch.float64, requires_grad=True) for _ in blocks]
    d_a = [torch.zeros(1, n, hidden, dtype=torch.float64, requires_grad=True) for _ in blocks]
    handles = []
    for t, (block, output) in enumerate(zip(blocks, attention_outputs)):
        def pre(module, args, kwargs, t=t):
            if args:
                return (args[0] + d_x[t], *args[1:]), kwargs
            return args, kwargs | {"hidden_states": kwargs["hidden_states"] + d_x[t]}
        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(output.register_forward_hook(
            lambda module, args, value, t=t: value + d_a[t].reshape(value.shape)))
    try:
        with full_precision(model):  # a float64 model in float64 throughout, as measure runs it
            logits = model(input_ids=torch.as_tensor(ids), use_cache=False).logits[0, -1]
            grads = torch.autograd.grad(torch.softmax(logits, -1).max(), d_x + d_a)
    finally:
        for handle in handles:
            handle.remove()
    norms = np.array([np.linalg.norm(g[0].detach().numpy(), axis=-1).sum() for g in grads])
    return 1.0 - norms[len(blocks):] / norms[: len(blocks)]
