"""Measuring real models (PyTorch): lambda_t, content scores, gradient influence.

The data the rollout theory of arXiv 2602.16837 is fitted to and compared
with, from Hugging Face causal LMs: per block the mixing coefficient
``lambda_t = mean ||a|| / (||x|| + ||a||)``, per layer and head the content
scores of ``q_i . k_j``, the dataset-averaged attention, and the influence
``||d f / d e_j||`` of each input embedding on the top next-token
probability at the last position. Needs the optional extra
``jaxroll[measure]`` (torch, transformers).
"""

from .layer_maps import LAYER_MAPS as LAYER_MAPS, LayerMap as LayerMap, layer_map_for as layer_map_for
from .measure import (
    DEFAULT_STATS as DEFAULT_STATS,
    STATS as STATS,
    Measurement as Measurement,
    influence_gradients as influence_gradients,
    measure as measure,
    parse_stats as parse_stats,
)
from .outputs import read_measurement as read_measurement, write_measurement as write_measurement
from .texts import load_tokenizer as load_tokenizer, read_texts as read_texts, select_sequences as select_sequences
from .loading import load_model as load_model
