"""``jaxroll measure``: lambda_t, content and influence of a local Hugging Face model."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    measure = commands.add_parser(
        "measure", help="measure lambda_t, content scores and influence on a local Hugging Face model",
        description="Measure a causal LM saved in MODEL_DIR (local files only): lambda_t per block, "
                    "content scores per layer and head, gradient influence of each input position, "
                    "optionally the mean attention. Writes measurement.npz, metadata.json, config.yaml, "
                    "influence.csv, lambdas.png and influence.png into --out. Needs jaxroll[measure].")
    measure.add_argument("model", type=Path, metavar="MODEL_DIR", help="directory written by save_pretrained")
    measure.add_argument("--texts", type=Path, required=True,
                         help=".txt (blank-line separated documents), .jsonl (field 'text') or a saved dataset")
    measure.add_argument("--length", type=_common.positive_int, required=True, help="tokens per sequence N")
    measure.add_argument("--samples", type=_common.positive_int, required=True, help="number of sequences S")
    measure.add_argument("--out", type=Path, required=True, help="output directory")
    measure.add_argument("--stats", default="lambda,content,influence",
                         help="comma-separated subset of lambda,content,influence,attention,qk "
                              "(default lambda,content,influence)")
    measure.add_argument("--dtype", choices=("bfloat16", "float32", "float64"), default="float32",
                         help="model dtype (default float32)")
    measure.add_argument("--falcon-alibi", choices=("once", "doubled"), default="once",
                         help="Falcon's ALiBi: once (intended, default) or doubled (its eager path)")
    measure.add_argument("--positions", type=_common.positive_int, default=1,
                         help="keep qk_mean at every K-th position (with --stats ...,qk)")
    measure.add_argument("--no-checkpointing", action="store_true",
                         help="hold every block's activations during the influence pass")
    measure.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    measure.add_argument("--force", action="store_true", help="write into a non-empty --out")
    measure.set_defaults(run=_run_measure)


def _run_measure(arguments) -> None:
    from .. import io

    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("measure: needs torch and transformers; install jaxroll[measure]") from None
    from .. import measure

    stats = measure.parse_stats(arguments.stats)
    if arguments.resume and not (arguments.out / "checkpoint.npz").is_file():
        raise ConfigError(f"--resume: no checkpoint.npz in {arguments.out}; allowed: the --out of an interrupted run")
    # Everything is read and checked before --out is touched.
    documents = measure.read_texts(arguments.texts)
    model = measure.load_model(arguments.model, dtype=arguments.dtype)
    tokenizer = measure.load_tokenizer(arguments.model)
    token_ids, indices = measure.select_sequences(documents, tokenizer, arguments.length, arguments.samples)
    _check_measure_memory(model.config, stats, arguments)
    out = arguments.out if arguments.resume else io.prepare_output_dir(arguments.out, force=arguments.force)
    checkpoint = out / "checkpoint.npz"
    try:
        result = measure.measure(
            model, token_ids, stats=stats, falcon_alibi=arguments.falcon_alibi, positions=arguments.positions,
            checkpointing=not arguments.no_checkpointing, progress=True, checkpoint_path=checkpoint,
            resume=arguments.resume, source=str(arguments.model))
    except KeyboardInterrupt:
        raise ConfigError(f"measure: interrupted; the completed sequences are in {checkpoint}, rerun with --resume") from None
    result.document_indices = indices
    result.metadata["protocol"] = {
        "texts": str(arguments.texts), "documents": len(documents),
        "rule": "documents in order, keep those with >= N tokens, take the first N, no padding",
        "tokenizer_defaults": "add_special_tokens as the tokenizer's default", "length": arguments.length,
        "samples": arguments.samples}
    written = measure.write_measurement(result, out, overwrite=True)
    checkpoint.unlink(missing_ok=True)
    _print_measure_summary(result, out, written)


def _check_measure_memory(config, stats, arguments) -> None:
    """Refuse ``--stats attention`` / ``qk`` whose float64 means cannot fit: (L, N, N) and (L, H, n, n)."""
    from .. import memory

    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    n = arguments.length
    needed = 0
    if "attention" in stats:
        needed += 8 * layers * n * n
    if "qk" in stats:
        kept = len(range(0, n, arguments.positions))
        needed += 8 * layers * heads * kept * kept
    memory.check_fits(needed, f"measure --stats {arguments.stats} at N = {n}", allowed=(
        "a shorter --length, fewer --stats (or --positions K for qk)"))


def _print_measure_summary(result, out, written) -> None:
    import numpy as np

    meta = result.metadata
    print(f"jaxroll measure: {meta['model']} ({meta['model_type']}, {meta['num_layers']} layers, "
          f"{meta['num_heads']} heads, {meta['dtype']})")
    print(f"  S = {meta['num_sequences']} sequences of N = {result.sequence_length} tokens; "
          f"formula: {meta['logit_formula']}")
    if result.lambdas is not None:
        print(f"  lambda_t: mean {float(np.mean(result.lambdas)):.4g}, first {result.lambdas[0]:.4g}, "
              f"last {result.lambdas[-1]:.4g}")
    if result.influence is not None:
        print(f"  influence: p[0] = {result.influence[0]:.4g}, p[-1] = {result.influence[-1]:.4g}, "
              f"argmin = {int(np.argmin(result.influence))}")
    print(f"  wrote {out}/" + ", ".join(path.name for path in written))
