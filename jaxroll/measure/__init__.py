"""Measuring real models (PyTorch): lambda_t, content scores, gradient influence.

The data the rollout theory of arXiv 2602.16837 is fitted to and compared
with, from Hugging Face causal LMs: per block the mixing coefficient
``lambda_t = mean ||a|| / (||x|| + ||a||)``, per layer and head the content
scores of ``q_i . k_j``, the dataset-averaged attention, the influence
``||d f / d e_j||`` of each input embedding on the top next-token
probability at the last position, attention sinks. Needs the optional
extra ``jaxroll[measure]`` (torch, transformers).

Names load lazily: `jaxroll.measure.uncertainty` (bootstrap intervals, the
noise floor) and `jaxroll.measure.progress` are pure NumPy / Python and
import without torch.
"""

from .._lazy import lazy_names

_NAMES = {
    "LAYER_MAPS": "layer_maps", "LayerMap": "layer_maps", "layer_map_for": "layer_maps",
    "BUILTIN_STATS": "registry", "DEFAULT_STATS": "registry", "Statistic": "registry", "Shapes": "registry",
    "allowed_stats": "registry", "check_stats_allowed": "registry", "default_stats": "registry",
    "register_statistic": "registry", "statistic_names": "registry", "stats_bytes": "registry",
    "parse_stats": "registry", "Measurement": "result", "PartialSums": "partial_sums",
    "influence_gradients": "passes", "measure": "passes",
    "read_measurement": "outputs", "write_measurement": "outputs",
    "load_tokenizer": "texts", "read_texts": "texts", "select_sequences": "texts",
    "load_model": "loading", "inspect_model": "loading", "ModelPlan": "loading",
    "attention_implementation": "loading", "offset_rollout_model": "offsets",
    "score": "uncertainty", "Score": "uncertainty",
    "Progress": "progress", "layer_paths": "paths", "PathInfluence": "paths",
    "track": "tracking", "track_callback": "tracking", "track_trainer": "tracking",
    "find_checkpoints": "series", "read_series": "series", "update_series": "series",
}

__all__ = sorted(_NAMES)


__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())

