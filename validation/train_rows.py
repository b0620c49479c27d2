"""Train the ALiBi subjects of the rows study: BLOOM with and without the final LayerNorm, two seeds each.

    PYTHONPATH=. python3 validation/train_rows.py --out validation/models/rows \
        [--reference validation/models/wave5] [--steps 4000] [--seeds 0,1]

The geometry, corpus, tokenizer and optimiser of `validation/train.py` (docs/validation.md's
run 3: 4 layers, 4 heads, hidden 64, N = 64), the same step budget for every model, so
the final norm's effect can be told from training noise. The tokenizer and held-out
texts are those of ``--reference`` (the wave-5 models), so every subject is measured on
the same sequences. A model without the final norm has ``ln_f`` replaced by the identity
and ``jaxroll_final_norm: false`` in its ``config.json``; `load` restores the identity
(transformers would rebuild the LayerNorm). Writes ``bloom-{norm,no-norm}-seed{S}/`` and
``training.json`` into ``--out``; a model already there is kept (resumable).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline  # noqa: E402
import run  # noqa: E402


def load(directory, dtype=torch.float64):
    """A trained subject in eval mode, with the identity for ``ln_f`` where it was trained without it."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager",
                                                              dtype=dtype)
    if getattr(model.config, "jaxroll_final_norm", True) is False:
        model.transformer.ln_f = torch.nn.Identity()
    return model.eval()


def main(argv=None) -> int:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reference", type=Path, default=Path("validation/models/wave5"))
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-time cap per model")
    own = parser.parse_args(argv)
    arguments = run.parse(["--out", "unused", "--steps", "0"])
    torch.set_num_threads(1)
    geometry = pipeline.Geometry(arguments.layers, arguments.heads, arguments.hidden, arguments.length)
    tokenizer = transformers.AutoTokenizer.from_pretrained(own.reference / "bloom-trained")
    train_texts, held_texts = pipeline.split_corpus(pipeline.stdlib_files()[: arguments.corpus_files])
    train_stream = pipeline.token_stream(tokenizer, train_texts)
    held_stream = pipeline.token_stream(tokenizer, held_texts)
    own.out.mkdir(parents=True, exist_ok=True)
    summary_path = own.out / "training.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for seed in (int(item) for item in own.seeds.split(",")):
        for final_norm in (True, False):
            name = f"bloom-{'norm' if final_norm else 'no-norm'}-seed{seed}"
            if (own.out / name / "model.safetensors").exists():
                continue
            model = pipeline.build_model("bloom", geometry, len(tokenizer), seed)
            if not final_norm:
                model.transformer.ln_f = torch.nn.Identity()
                model.config.jaxroll_final_norm = False
            print(f"training {name}", flush=True)
            curve = pipeline.train(model, train_stream, held_stream, steps=own.steps, length=arguments.length,
                                   batch_size=arguments.batch, seed=seed, eval_every=arguments.eval_every,
                                   max_seconds=60 * own.minutes)
            model.save_pretrained(own.out / name)
            tokenizer.save_pretrained(str(own.out / name))
            summary[name] = run._training_summary(curve, model) | {"final_norm": final_norm, "seed": seed}
            summary_path.write_text(json.dumps(summary, indent=2) + "\n")
            print(json.dumps(summary[name]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
