"""Is the temperature sign miss on BLOOM the softmax-derivative (query/key) gradient path?

    PYTHONPATH=. python3 validation/value_path.py MODEL_DIR MEASUREMENT.npz


Gradient influence ||d f / d e_j|| (f = top next-token probability at the last position, as jaxroll measure),
full vs with the attention probabilities detached (gradient through values, residuals and MLPs only),
under tau in {1, 0.7, 1.5} applied by jaxroll's patch. Middle mass (fraction 0.1) of each mean profile.
"""
import sys, types
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np, torch, transformers
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import pipeline
from jaxroll import interventions
from jaxroll.measure import patching
from jaxroll.measure.effect import middle_mass
import transformers.models.bloom.modeling_bloom as mb

torch.set_num_threads(1)
model = pipeline.load_float64(sys.argv[1])
ids = torch.as_tensor(np.load(sys.argv[2])["token_ids"])

def influence(detach: bool):
    original = mb.F
    if detach:
        mb.F = types.SimpleNamespace(**{k: getattr(original, k) for k in dir(original) if not k.startswith("__")})
        mb.F.softmax = lambda *a, **k: original.softmax(*a, **k).detach()
    try:
        rows = []
        for s in range(0, ids.shape[0], 16):
            batch = ids[s:s + 16]
            embeds = model.get_input_embeddings()(batch).detach().requires_grad_(True)
            logits = model(inputs_embeds=embeds).logits[:, -1]
            probs = torch.softmax(logits, -1)
            top = probs.max(-1).values.sum()
            (grad,) = torch.autograd.grad(top, embeds)
            rows.append(grad.norm(dim=-1).numpy())
        rows = np.concatenate(rows)
        return rows.sum(0) / rows.sum()
    finally:
        mb.F = original

for detach in (False, True):
    base = None
    for spec in (None, "tau=0.7", "tau=1.5", "ssmax_scale=0.5", "slope_scale=0.5"):
        changes = interventions.parse(spec) if spec else []
        if changes:
            with patching.patch(model, changes):
                profile = influence(detach)
        else:
            profile = influence(detach)
        mm = float(middle_mass(profile))
        base = mm if base is None else base
        print(f"{'values only' if detach else 'full      '} {spec or 'baseline':18s} middle {mm:.4f} change {mm - base:+.4f}", flush=True)
