"""``jaxroll measure``: lambda_t, content and influence of a local Hugging Face model.

Checks first, loads later: the architecture, the statistics it allows, N
against the model's limit, the memory of the requested statistics and the
texts are all checked from ``config.json``, the tokenizer and the texts
before the weights load and before ``--out`` is touched. Under torchrun
(``WORLD_SIZE > 1``) every rank measures its block of the sequences and
rank 0 merges the partial sums and writes the outputs
(`jaxroll.measure.distributed`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from ..errors import ConfigError
from . import _common, _names

PROGRESS_DELAY = 2.0
"""Seconds before ``jaxroll measure`` shows a progress bar or its first line."""


def add_parser(commands) -> None:
    measure = commands.add_parser(
        "measure", help="measure lambda_t, content scores and influence on a local Hugging Face model",
        description="Measure a causal LM saved in MODEL_DIR (local files only): lambda_t per block, "
                    "content scores per layer and head, gradient influence of each input position "
                    "(mean and per sequence), optionally the mean attention and attention sinks. Writes "
                    "measurement.npz, metadata.json, config.yaml, influence.csv, lambdas.png and "
                    "influence.png into --out. Data parallel under torchrun: torchrun --nproc-per-node K "
                    "-m jaxroll measure ... Needs jaxroll[measure].")
    measure.add_argument("model", type=Path, nargs="+", metavar="MODEL_DIR",
                         help="directory written by save_pretrained; several (named checkpoint-STEP or STEP), or "
                              "a training output folder of checkpoint-STEP/ subfolders, measure a series: each "
                              "step into OUT/checkpoint-STEP/ on the same sequences, and the summary into "
                              "OUT/series/ (docs/training.md)")
    measure.add_argument("--texts", type=Path, required=True,
                         help=".txt (blank-line separated documents), .jsonl (field 'text', or token ids in "
                              "'input_ids' or 'prompt_ids': no tokenizer needed) or a saved dataset")
    measure.add_argument("--length", type=_common.positive_int, required=True, help="tokens per sequence N")
    measure.add_argument("--samples", type=_common.positive_int, required=True, help="number of sequences S")
    measure.add_argument("--out", type=Path, required=True, help="output directory")
    measure.add_argument("--stats", default=None,
                         help="comma-separated subset of lambda,content,influence,attention,qk,sinks,"
                              "attention_offsets,attention_gains,attention_distances,paths,sequence_rollout,"
                              f"{','.join(_names.REFINEMENT_STATS)} "
                              "(default: lambda,content,influence for ALiBi models; lambda,influence (rotary) or "
                              "lambda,content,influence (learned positions) plus the measured kernel otherwise: "
                              "attention while 8 L N^2 bytes fit 64 MiB, else attention_offsets, and "
                              "attention_gains and attention_distances while each one's tables (16 L N^2 floats) fit "
                              "64 MiB; every default ends "
                              "with paths; docs/measuring.md)")
    measure.add_argument("--refine", default=None, metavar="SWITCHES",
                         help="also write refined.csv, the refined rollout's profile with these switches on "
                              f"(comma-separated subset of {','.join(_names.REFINEMENT_SWITCHES)}; "
                              "docs/refinements.md), and with --queries its rows as refined_rows (K, N) in "
                              "measurement.npz; the statistics it needs are added to the default --stats")
    measure.add_argument("--queries", default=None, metavar="K|i,j,...",
                         help="also measure the gradient influence on K evenly spaced query positions (the last "
                              "is N-1) or on the listed positions: rows of P_T, written to measurement.npz as "
                              "influence_rows (K, N), influence_rows_per_sequence (S, K, N) and query_positions "
                              "(docs/rows.md)")
    measure.add_argument("--row-target", choices=("probability", "hidden"), default=None,
                         help="with --queries: what the rows differentiate, the max next-token probability at "
                              "each query (default) or the hidden state entering the final norm, the Frobenius "
                              "norm of its D x D Jacobian (D backward passes per query; docs/measuring.md); "
                              "metadata.json records it as row_target")
    measure.add_argument("--dtype", choices=("bfloat16", "float16", "float32", "float64"), default="float32",
                         help="model dtype (default float32); statistics accumulate in float64 whatever it is")
    measure.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                         help="where the model runs (default cpu; auto: cuda when available; under torchrun "
                              "each rank takes cuda:LOCAL_RANK)")
    measure.add_argument("--device-map", choices=("auto",), default=None,
                         help="spread a model larger than one device over all devices (needs accelerate)")
    measure.add_argument("--falcon-alibi", choices=("once", "doubled"), default="once",
                         help="Falcon's ALiBi: once (intended, default) or doubled (its eager path)")
    measure.add_argument("--positions", type=_common.positive_int, default=1,
                         help="keep qk_mean at every K-th position (with --stats ...,qk)")
    measure.add_argument("--batch-size", type=_common.positive_int, default=None,
                         help="sequences per forward and backward pass (default: as many as the device's free "
                              "memory holds, at most 64); results do not depend on it")
    _common.add_intervene_argument(
        measure, "measure the model changed by interventions, applied to its attention for the run (jaxroll "
                 "rollout --intervene predicts the same change)",
        "metadata.json, measurement.npz and config.yaml record it")
    measure.add_argument("--no-checkpointing", action="store_true",
                         help="hold every block's activations during the influence pass (default: checkpoint "
                              "each block only where memory needs it)")
    measure.add_argument("--quiet", action="store_true",
                         help="no progress (default: a bar on a terminal, a line every 5%% or 30 s on stderr "
                              "otherwise; nothing in the first 2 s but a closing line)")
    measure.add_argument("--resume", action="store_true", help="continue from the checkpoint(s) in --out")
    measure.add_argument("--force", action="store_true", help="write into a non-empty --out")
    _common.add_json_argument(measure)
    # uses_jax: the compilation cache (and JAX) load after the refusals (_run_measure)
    measure.set_defaults(run=_run_measure, uses_jax=False)


def _run_measure(arguments) -> None:
    _refuse_early(arguments)
    if getattr(arguments, "command_line", False):  # as `main` does for the other commands, after the refusals
        from .. import cache as compilation_cache

        compilation_cache.enable()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("measure: needs torch and transformers; install torch first (the CPU build: python3 -m "
                          "pip install torch --index-url https://download.pytorch.org/whl/cpu; a GPU: python3 -m pip "
                          "install torch), then python3 -m pip install 'jaxroll[measure]'") from None
    models = arguments.model
    if len(models) == 1 and not (models[0].is_dir() and not (models[0] / "config.json").exists()):
        _measure_one(arguments, Target(models[0], arguments.out, arguments.resume, arguments.force))
    else:  # several folders, or a training output folder: a series (jaxroll.measure.series)
        _measure_series(arguments)


@dataclasses.dataclass(frozen=True)
class Target:
    """One model folder measured into one output folder (a step of a series, or the whole command)."""

    model: Path
    out: Path
    resume: bool
    force: bool


@dataclasses.dataclass(frozen=True)
class Request:
    """What the arguments ask of one measurement, checked before the weights load."""

    plan: object              # jaxroll.measure.ModelPlan of config.json
    changes: tuple            # the interventions
    sinks: int                # k sink tokens in front (0 without)
    stats: tuple
    refine: tuple | None      # --refine switches
    queries: object           # the query positions (K,) of --queries, or None


def _request(arguments, target: Target, world) -> Request:
    """Everything read and checked before the weights load and --out is touched."""
    from .. import measure
    from ..measure.additions import sink_count
    from ..measure.torch_plan import parse_for

    given = None if arguments.stats is None else measure.parse_stats(arguments.stats)
    _check_resume(target, world)
    plan = measure.inspect_model(target.model)
    changes = tuple(parse_for(arguments.intervene, plan.config))
    sinks = sink_count(changes)
    # The default at this N and depth: the dense mean kernel while it is cheap, else the offsets (default_stats).
    default = measure.default_stats(plan.position, arguments.length, plan.num_layers)
    stats, refine = _stats_and_refine(arguments, given or default, given is not None)
    measure.check_stats_allowed(stats, plan.layer_map, plan.position)
    _check_length(arguments, plan.config, sinks, plan.max_length)
    if "content" in stats and arguments.length < 2:
        raise ConfigError("--length: 1; allowed: >= 2 for content (the base is the mean below the diagonal)")
    return Request(plan, changes, sinks, stats, refine, _queries(arguments, world))


def _check_resume(target: Target, world) -> None:
    """--resume needs the checkpoint of an interrupted run in --out."""
    checkpoint = target.out / _checkpoint_name(world)
    if target.resume and not checkpoint.is_file():
        raise ConfigError(f"--resume: no {checkpoint.name} in {target.out}; allowed: the --out of an "
                          "interrupted run (with the same number of processes)")


def _check_length(arguments, config, sinks: int, max_length: int | None) -> None:
    """--length (with the sinks in front) within the model's positions; sinks without --queries and --refine."""
    if sinks:
        from ..measure.torch_plan import check_sink_length

        check_sink_length(config, arguments.length, sinks)
        for flag, given_flag in (("--queries", arguments.queries), ("--refine", arguments.refine)):
            if given_flag is not None:
                raise ConfigError(f"{flag}: with sinks={sinks}; allowed: sinks without {flag} (its rows and "
                                  "kernels are not split at the sinks)")
    if max_length is not None and arguments.length > max_length:
        raise ConfigError(f"--length: {arguments.length}; allowed: at most the model's max_seq_len "
                          f"({max_length})")


def _refuse_early(arguments) -> None:
    """The refusals that the flags and config.json decide, made before torch and transformers import.

    --refine, --queries and --row-target from the flags; --intervene, the
    sinks and MPT's ``max_seq_len`` against each model folder's config.json
    read with `json` (`torch_plan.config_json`; a folder it cannot read
    alone is left to the transformers config). `_request` checks all of it
    again once they load, with what needs them (the tokenizer, the memory).
    """
    for model in arguments.model:
        _common.check_model_folder(model)
    from ..measure.distributed import from_environment
    from ..measure.registry import parse_stats

    world = from_environment()
    if arguments.stats is not None:
        try:
            parse_stats(arguments.stats)  # the registry loads its statistics without torch
        except ConfigError as error:
            raise error.renamed("--stats") from None
    if arguments.refine is not None:
        refine_switches(arguments.refine)
    _queries(arguments, world)
    from ..measure.additions import sink_count
    from ..measure.series import find_checkpoints
    from ..measure.torch_plan import config_json, parse_for, position_limit

    models = arguments.model
    if len(models) == 1 and not (models[0].is_dir() and not (models[0] / "config.json").exists()):
        folders = [models[0]]
        _check_resume(Target(models[0], arguments.out, arguments.resume, arguments.force), world)
    else:  # a series; folders that are not one are refused after the imports, as before (torch's advice first)
        try:
            folders = [folder for _, folder in find_checkpoints(models)]
        except ConfigError:
            folders = []
    for folder in folders:
        config = config_json(folder)
        if config is not None:
            limit, field = position_limit(config)
            _check_length(arguments, config, sink_count(parse_for(arguments.intervene, config)),
                          limit if field == "max_seq_len" else None)


def _stats_and_refine(arguments, stats, given: bool) -> tuple:
    """The statistics to measure (those --refine needs added to the default) and the --refine switches."""
    if arguments.refine is None:
        return stats, None
    refine, needed = refine_switches(arguments.refine)
    missing = [name for name in needed if name not in stats]
    if missing and given:
        raise ConfigError(f"--refine {arguments.refine}: needs --stats {missing[0]}; allowed: --stats "
                          f"including {','.join(needed)}, or no --stats")
    return tuple(dict.fromkeys((*stats, *missing))), refine


def _queries(arguments, world):
    """The query positions of --queries (None without); --row-target needs them, torchrun refuses them."""
    if arguments.row_target is not None and arguments.queries is None:
        raise ConfigError(f"--row-target {arguments.row_target}: without --queries; allowed: --queries K|i,j,... "
                          "with it (the rows it measures)")
    if arguments.queries is None:
        return None
    from ..theory.rows import query_positions

    positions = query_positions(arguments.length, arguments.queries)
    if world.distributed:
        raise ConfigError("--queries: under torchrun; allowed: a single process (the rows are "
                          "measured after the merge, on one process)")
    return positions


def _checkpoint_name(world) -> str:
    from ..measure.distributed import checkpoint_name

    return checkpoint_name(world)


def _device(arguments, world) -> str:
    """--device resolved (under torchrun each rank its cuda:LOCAL_RANK); --device-map needs accelerate."""
    from ..measure import loading

    device = loading.resolve_device(arguments.device)
    if world.distributed and device == "cuda" and arguments.device_map is None:
        device = f"cuda:{world.local_rank}"
    if arguments.device_map is not None:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise ConfigError("--device-map auto: needs accelerate; pip install accelerate") from None
    return device


def _measure_one(arguments, target: Target) -> None:
    """One model folder into one output folder: the whole of ``jaxroll measure MODEL_DIR``."""
    from .. import measure
    from ..measure import distributed

    world = distributed.from_environment()
    request = _request(arguments, target, world)
    _check_measure_memory(request.plan, request.stats, arguments, request.sinks, request.queries)
    device = _device(arguments, world)
    documents = measure.read_texts(arguments.texts)
    from ..measure.texts import is_token_ids

    # Token ids (.jsonl with input_ids/prompt_ids) need no tokenizer: a synthetic vocabulary has none.
    tokenizer = None if is_token_ids(documents) else measure.load_tokenizer(target.model)
    token_ids, indices = measure.select_sequences(documents, tokenizer, arguments.length, arguments.samples)
    if world.distributed and arguments.samples < world.size:
        raise ConfigError(f"--samples: {arguments.samples}; allowed: at least one sequence per process "
                          f"({world.size})")
    distributed.init(world, device)
    try:
        _prepare_out(target, world)
        result = _run(arguments, target, request, world, device, tokenizer, token_ids, indices, len(documents))
        if result is not None:
            written = measure.write_measurement(result, target.out, overwrite=True)
            for rank in range(world.size):  # every rank's sums are merged into the outputs
                (target.out / _checkpoint_name(distributed.World(rank, world.size))).unlink(missing_ok=True)
            _print_measure_summary(result, target.out, written, arguments.json)
    finally:
        distributed.finalize(world)


def _prepare_out(target: Target, world) -> None:
    """--out prepared on rank 0 (unless resuming); its refusal reaches every rank."""
    from .. import io
    from ..measure import distributed

    error = None
    if world.is_main and not target.resume:
        try:
            io.prepare_output_dir(target.out, force=target.force)
        except ConfigError as refused:
            error = str(refused)
    error = distributed.broadcast_error(world, error)
    if error is not None:
        raise ConfigError(error)


def _run(arguments, target: Target, request: Request, world, device, tokenizer, token_ids, indices, documents):
    """Load the weights and measure (`jaxroll.measure.measure`, rows and refinement included); None off rank 0."""
    from .. import measure
    from ..measure import distributed, loading

    checkpoint = target.out / _checkpoint_name(world)
    model = measure.load_model(target.model, dtype=arguments.dtype, device=device, device_map=arguments.device_map,
                               attn_implementation=loading.attention_implementation(
                                   request.plan.config, request.stats, arguments.falcon_alibi))
    progress = False
    if not arguments.quiet and world.is_main:
        from ..measure.progress import Progress

        label = "jaxroll measure" + (f" (rank 0 of {world.size})" if world.distributed else "")
        # delay: a job shorter than 2 s prints its closing line only (not 20 lines).
        progress = Progress(len(_shard(arguments.samples, world)), label=label,
                            initial=_done(checkpoint) if target.resume else 0, delay=PROGRESS_DELAY)
    record = {"processes": world.size,
              "device": arguments.device if arguments.device_map is None else "device_map=auto",
              "protocol": {"texts": str(arguments.texts), "documents": documents,
                           "rule": "documents in order, keep those with >= N tokens, take the first N, no padding",
                           "tokenizer_defaults": "add_special_tokens as the tokenizer's default",
                           "length": arguments.length, "samples": arguments.samples}}
    try:
        return measure.measure(
            model, token_ids, stats=request.stats, falcon_alibi=arguments.falcon_alibi, positions=arguments.positions,
            checkpointing=False if arguments.no_checkpointing else None, progress=progress, checkpoint_path=checkpoint,
            resume=target.resume, source=str(target.model), batch_size=arguments.batch_size,
            interventions=request.changes, tokenizer=tokenizer,
            shard=(world.rank, world.size) if world.distributed else None,
            reduce=(lambda sums: distributed.gather_to_rank0(world, sums)) if world.distributed else None,
            queries=request.queries, row_target=arguments.row_target, refine=request.refine,
            document_indices=indices, record=record)
    except KeyboardInterrupt:
        print(f"jaxroll measure: interrupted; the completed sequences are in {checkpoint}; rerun the same "
              "command with --resume to continue", file=sys.stderr)
        raise


def refine_switches(text: str) -> tuple[tuple, tuple]:
    """``--refine`` -> (switches, the statistics they need), checked without JAX.

    A combination needs its lambda (``lambda``, or the ingredient of
    position, mlp or gradient; gradient also ``influence``), its kernels
    (``attention_heads``, or ``norm_kernels`` with norm) and the ingredient
    of heads, head_positions and input_norm where on. gradient replaces
    lambda_t, so it does not combine with position or mlp; head_positions
    replaces heads.
    """
    switches = tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    unknown = [item for item in switches if item not in _names.REFINEMENT_SWITCHES]
    if unknown or not switches:
        raise ConfigError(f"--refine: got {unknown[0] if unknown else 'nothing'!r}; allowed: a comma-separated "
                          f"subset of {','.join(_names.REFINEMENT_SWITCHES)}")
    if "gradient" in switches and {"position", "mlp"} & set(switches):
        raise ConfigError(f"--refine {text}: gradient with position or mlp; allowed: gradient replaces "
                          "lambda_t, so it combines with norm, heads, head_positions and input_norm only")
    if {"heads", "head_positions"} <= set(switches):
        raise ConfigError(f"--refine {text}: heads with head_positions; allowed: one of them (head_positions "
                          "replaces heads' one weight per layer)")
    lam = next((item for item in ("gradient", "mlp", "position") if item in switches), None)
    needed = [_names.REFINEMENT_STAT_FOR[lam]] if lam else ["lambda"]
    needed += ["influence"] if lam == "gradient" else []
    needed += [_names.REFINEMENT_STAT_FOR["norm"] if "norm" in switches else "attention_heads"]
    needed += [_names.REFINEMENT_STAT_FOR[item] for item in ("heads", "head_positions", "input_norm")
               if item in switches]
    return switches, tuple(needed)


def _shard(samples, world):
    import numpy as np

    return np.array_split(np.arange(samples), world.size)[world.rank]


def _done(checkpoint) -> int:
    """Sequences already in `checkpoint`, for the progress count; 0 when it cannot be read.

    A file that is not a checkpoint is refused in one line by the measurement
    itself (`PartialSums.load`), not here.
    """
    import zipfile

    import numpy as np

    try:
        with np.load(checkpoint, allow_pickle=False) as data:
            return int(data["count"]) if "count" in data.files else 0
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
        return 0


def _check_measure_memory(plan, stats, arguments, sinks: int, queries) -> None:
    """Refuse, before loading, a run whose estimated peak memory exceeds the free memory.

    The estimate is `jaxroll.measure.batching.measure_peak` from
    ``config.json``: on the CPU the whole process's peak resident set (what is
    resident now, the weights, ``--batch-size`` sequences (1 when it is chosen
    from free memory), the pass's chunks and the float64 sums), of which the
    growth beyond what is resident now must fit in the available RAM; on a
    GPU the weights and the pass against its free memory, the sums against
    the RAM. The refusal names the field (``--length`` or ``--batch-size``),
    its value and the largest that fits.
    """
    from .. import memory
    from ..measure import stats_bytes
    from ..measure.batching import free_bytes, largest_fitting, measure_peak, rows_recomputed, weight_bytes
    from ..measure.loading import attention_implementation, resolve_device
    from ..measure.registry import Shapes

    length = arguments.length + sinks  # the model runs at N + k with sinks in front
    device = resolve_device(arguments.device) if arguments.device_map is None else "map"
    if device != "cpu":  # the sums stay in RAM; on the CPU they are part of the estimate below
        needed = stats_bytes(stats, Shapes(arguments.samples, plan.num_layers, plan.num_heads, length),
                             arguments.positions)
        needed += 8 * (arguments.samples + 1) * len(queries) * length if queries is not None else 0
        memory.check_fits(needed, f"measure --stats {','.join(stats)} at N = {length}",
                          allowed="a shorter --length, fewer --stats (or --positions K for qk)")
    if arguments.device_map is not None:
        return  # spread over several devices: each holds a part, not estimated here
    itemsize = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}[arguments.dtype]
    implementation = attention_implementation(plan.config, stats, arguments.falcon_alibi)
    eager, recompute = implementation == "eager", rows_recomputed(plan.config, implementation, stats)
    resident = memory.resident_bytes() if device == "cpu" else 0
    weights = weight_bytes(plan.config, itemsize)  # once: the meta-device count costs a model build

    def estimate(n, batch):
        return measure_peak(plan.config, stats=stats, length=n, batch=batch, samples=arguments.samples,
                            itemsize=itemsize, eager=eager, checkpointing=not arguments.no_checkpointing,
                            positions=arguments.positions, queries=0 if queries is None else len(queries),
                            device=device, resident=resident, recompute=recompute, weights=weights)

    batch = arguments.batch_size or 1
    peak = estimate(length, batch)
    free = free_bytes(device)
    if peak.growth <= free:
        return
    size = memory.format_size
    front = f" + {sinks} sinks" if sinks else ""
    what = (f"{arguments.length}{front} (batch {batch}, {arguments.dtype}, {'eager' if eager else 'sdpa'} attention, "
            f"--stats {','.join(stats)}): the run peaks at about {size(peak.total)} (resident now "
            f"{size(peak.resident)}, weights {size(peak.weights)}, {size(peak.per_sequence)} per sequence, "
            f"{size(peak.per_pass)} per pass, sums {size(peak.sums)}), {size(peak.growth)} more than now; "
            f"{'the GPU' if device != 'cpu' else 'this machine'} has {size(free)} free")
    if batch > 1 and estimate(length, 1).growth <= free:
        fits = largest_fitting(free, lambda b: estimate(length, b).growth, 1, upper=batch)
        allowed = f"--batch-size {fits} or less (or none: chosen from free memory)"
        raise ConfigError(f"--batch-size: got {batch} at N = {what}; allowed: {allowed}",
                          field="--batch-size", value=batch, allowed=allowed)
    longest = largest_fitting(free, lambda n: estimate(n, 1).growth, 1, upper=length)
    allowed = (f"--length {longest - sinks} or less" if longest - sinks >= 1
               else "a smaller model or dtype (the weights alone do not fit)")
    allowed += ", fewer --stats or --positions K for qk" if "qk" in stats else ""
    raise ConfigError(f"--length: got {what}; allowed: {allowed}", field="--length", value=arguments.length,
                      allowed=allowed)


def _print_measure_summary(result, out, written, as_json: bool = False) -> None:
    import numpy as np

    from ..measure.registry import summary_lines

    meta = result.metadata
    if as_json:
        _common.print_json({"out": out, "written": [path.name for path in written], "metadata": meta})
        return
    print(f"jaxroll measure: {meta['model']} ({meta['model_type']}, {meta['num_layers']} layers, "
          f"{meta['num_heads']} heads, {meta['dtype']})")
    print(f"  S = {meta['num_sequences']} sequences of N = {result.sequence_length} tokens; "
          f"formula: {meta['logit_formula']}")
    if meta.get("interventions"):
        print("  intervened: " + ", ".join(f"{name}={value}" for name, value in meta["interventions"].items()))
    sinks = meta.get("sink_tokens")
    if sinks:
        mass = sinks.get("sink_mass_mean")
        print(f"  sinks: {sinks['count']} tokens of id {sinks['token_id']} ({sinks['token']}) before each sequence, "
              f"run at N + k = {sinks['run_length']}" + (f"; sink_mass mean {mass:.4g}" if mass is not None else ""))
    if result.lambdas is not None:
        print(f"  lambda_t: mean {float(np.mean(result.lambdas)):.4g}, first {result.lambdas[0]:.4g}, "
              f"last {result.lambdas[-1]:.4g}")
    if result.influence is not None:
        print(f"  influence: p[0] = {result.influence[0]:.4g}, p[-1] = {result.influence[-1]:.4g}, "
              f"argmin = {int(np.argmin(result.influence))}")
    for line in summary_lines(result):
        print(f"  {line}")
    composition = _written_composition(out, written)
    if composition is not None:
        print(f"  composition: q = {composition:.4g} (paths compose between linear, 1, and quadrature, 2; "
              "fitted to the measured influence, in config.yaml)")
    print(f"  wrote {out}/" + ", ".join(path.name for path in written))


def _written_composition(out, written) -> float | None:
    """The ``composition`` exponent of the config.yaml just written (None: none written, or q = 1)."""
    import yaml

    config = Path(out) / "config.yaml"
    if config not in [Path(path) for path in written]:
        return None
    return yaml.safe_load(config.read_text(encoding="utf-8")).get("composition")


def _measure_series(arguments) -> None:
    """``jaxroll measure`` over the checkpoints of MODEL_DIR... (`jaxroll.measure.series`).

    Checks first: the checkpoints (`find_checkpoints`), one architecture
    (`check_same_architecture`), the statistics a series needs, one
    tokenizer's token ids for every checkpoint, ``--out`` (empty, or
    ``--resume``, or ``--force``) and, with ``--resume``, that the series in
    ``--out`` was measured alike (`jaxroll.measure.series_check`): a refusal
    creates nothing and changes nothing. Then each step
    not yet finished is measured (a partial one resumed from its partial
    sums), and ``OUT/series/`` updated after each.
    """
    from .. import io
    from ..measure import series

    checkpoints = _series_checkpoints(arguments)
    out = arguments.out
    for number, (step, folder) in enumerate(checkpoints, start=1):
        target = series.checkpoint_folder(out, step)
        if arguments.resume and series.is_finished(target):
            print(f"jaxroll measure: step {step} ({number} of {len(checkpoints)}) already in {target}; skipped")
            continue
        print(f"jaxroll measure: step {step} ({number} of {len(checkpoints)}), {folder}")
        # --out as a whole was checked above: each step's folder is forced.
        one = Target(folder, target, arguments.resume and (target / "checkpoint.npz").is_file(), True)
        try:
            _measure_one(arguments, one)
        except KeyboardInterrupt:
            print(f"jaxroll measure: interrupted at step {step}; the finished steps are in {out}; rerun the same "
                  "command with --resume to continue", file=sys.stderr)
            raise
        series.update_series(out, [step])
        io.CREATED.clear()  # a later refusal keeps the finished steps
    folder = series.update_series(out)
    path = series.plot_series(folder, series.read_series(out))
    print(f"jaxroll measure: series of {len(checkpoints)} steps in {folder}/series.csv, series.npz; figure {path}")


def _series_checkpoints(arguments) -> list:
    """The series' ``(step, folder)`` pairs, every refusal of a series made before anything is created."""
    from .. import io
    from ..measure import (default_stats, inspect_model, load_tokenizer, parse_stats, read_texts, select_sequences,
                           series)
    from ..measure.distributed import from_environment

    if from_environment().distributed:
        raise ConfigError("measure: a series of checkpoints under torchrun; allowed: a single process (measure a "
                          "checkpoint under torchrun by its own folder)")
    checkpoints = series.find_checkpoints(arguments.model)
    plans = {folder: inspect_model(folder) for _, folder in checkpoints}
    series.check_same_architecture(plans)
    first = next(iter(plans.values()))
    stats = (parse_stats(arguments.stats) if arguments.stats is not None
             else default_stats(first.position, arguments.length, first.num_layers))
    missing = [name for name in ("lambda", "influence") if name not in stats]
    if missing:
        raise ConfigError(f"--stats {arguments.stats}: no {missing[0]}; allowed: --stats including lambda and "
                          "influence for a series (its summary compares the rollout with the measured profile)")
    if arguments.samples < 2:
        raise ConfigError(f"--samples: {arguments.samples}; allowed: >= 2 for a series (its summary judges the "
                          "prediction against the noise of the mean over sequences)")
    if arguments.resume:
        if not arguments.out.is_dir():
            raise ConfigError(f"--resume: no series in {arguments.out}; allowed: the --out of an interrupted series")
    else:
        io.check_output_dir(arguments.out, force=arguments.force)
    documents = read_texts(arguments.texts)
    reference = None
    for step, folder in checkpoints:  # the same sequences at every step
        token_ids, _ = select_sequences(documents, load_tokenizer(folder), arguments.length, arguments.samples)
        if reference is None:
            reference = (folder, token_ids)
        elif token_ids.shape != reference[1].shape or (token_ids != reference[1]).any():
            raise ConfigError(f"model {folder}: its tokenizer gives other token ids than {reference[0]}'s; allowed: "
                              "checkpoints with one tokenizer (the same sequences at every step)")
    if arguments.resume:  # what the series in --out recorded, against what this run would measure
        from ..measure import series_check

        measured = _stats_and_refine(arguments, stats, arguments.stats is not None)[0]
        new = [step for step, _ in checkpoints if not series.is_finished(series.checkpoint_folder(arguments.out, step))]
        series_check.check_extends(
            arguments.out, token_ids=reference[1], stats=measured, dtype=arguments.dtype, steps=new,
            architecture=series_check.architecture_of(first.layer_map, first.num_layers, first.num_heads),
            fields=series_check.COMMAND_FIELDS)
    return checkpoints
