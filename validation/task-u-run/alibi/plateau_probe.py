"""The 2-minute look at why BLOOM stayed at chance: the answer loss over 400 steps at one training length.

    OMP_NUM_THREADS=1 PYTHONPATH=. python3 validation/task-u-run/alibi/plateau_probe.py bloom 32 3e-3 400 2
    OMP_NUM_THREADS=1 PYTHONPATH=. python3 validation/task-u-run/alibi/plateau_probe.py bloom 64 3e-3 400 2

(arguments: family, length N, peak learning rate, steps, layers). Batches of
32 fresh cases from validation/train_task.py's `training_batch` (one-token
keys, 4 questions, ends-weighted depths), AdamW (0.9, 0.95), weight decay
0.1, linear warm-up over 50 steps, no decay, clipping at 1; prints the mean
loss and the last gradient norm (before clipping) every 50 steps. Chance is
ln 56 = 4.025 nats. Output of the two runs above: logs/plateau_probe.log.
"""

import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("train_task", ROOT / "train_task.py")
tt = importlib.util.module_from_spec(spec)
sys.modules["train_task"] = tt  # dataclasses look their module up by name
spec.loader.exec_module(tt)
torch.set_num_threads(1)
family, length, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
steps, layers = int(sys.argv[4]), int(sys.argv[5])
layout = tt.Layout(vocab=64, key_tokens=1, value_tokens=1)
model = tt.build_model(family, layout, layers=layers, heads=4, hidden=64, length=256, seed=0)
optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
rng, start, losses = np.random.default_rng([0, 7]), time.perf_counter(), []
for step in range(1, steps + 1):
    for group in optimizer.param_groups:
        group["lr"] = lr * min(1, step / 50)
    inputs, targets = tt.training_batch(layout, length, 32, rng, "ends", 4)
    loss = torch.nn.functional.cross_entropy(model(input_ids=inputs).logits.reshape(-1, 64), targets.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    losses.append(loss.item())
    if step % 50 == 0:
        print(f"{family} N={length} step {step} loss {np.mean(losses):.3f} grad norm {norm:.2f} "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        losses = []
