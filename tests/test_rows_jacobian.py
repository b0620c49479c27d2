"""influence_rows(target="hidden"): the Frobenius norm of d h_q / d e_j, h the residual stream entering the final norm.

The oracle is `torch.autograd.functional.jacobian` of a copy of the model
whose final norm is replaced by the identity: its returned last hidden state
(``output_hidden_states``' last entry, after the final norm in BLOOM and
Llama) is then the pre-norm state, with no hook involved. One sequence at a
time, float64 on both sides and under `full_precision` on both sides (no
float32 RMSNorm inside a Llama block): the two differ only by the summation
order of the same float64 operations (about 1e-14 relative); 1e-8 relative
leaves margin for the square root of a sum of D^2 squares, while any real
error (the after-norm state, a missing basis vector, another position) is O(1).
"""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxroll import ConfigError  # noqa: E402
from jaxroll.measure import influence_gradients  # noqa: E402
from jaxroll.measure import rows as rows_module  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402
from jaxroll.measure.rows import final_norm, influence_rows  # noqa: E402
from test_measure import tiny, token_ids  # noqa: E402
from tiny_tokenizer import run_cli, save_tiny, word_texts  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def _without_final_norm(model):
    twin = copy.deepcopy(model)
    module, before = final_norm(twin)
    if before:
        parent = twin.transformer if hasattr(twin, "transformer") else twin.model
        name = next(name for name, child in parent.named_children() if child is module)
        setattr(parent, name, torch.nn.Identity())
    return twin


def _oracle(model, ids, q):
    """``||d h_q / d e_j||_F`` for one sequence, from the full Jacobian ``(D, N, D)``."""
    twin = _without_final_norm(model)
    embeddings = model.get_input_embeddings()(torch.as_tensor(ids[None], dtype=torch.long)).detach()

    def state(e):
        return twin(inputs_embeds=e, use_cache=False, output_hidden_states=True).hidden_states[-1][0, q]

    with full_precision(twin):
        jacobian = torch.autograd.functional.jacobian(state, embeddings)  # (D, 1, N, D)
    return jacobian[:, 0].square().sum(dim=(0, 2)).sqrt().numpy()


@pytest.mark.parametrize("family", ["bloom", "llama"])
def test_hidden_rows_equal_the_jacobian_one_sequence_at_a_time(family, monkeypatch):
    model = tiny(family)
    ids = token_ids(3, 9, seed=5)
    rows, positions = influence_rows(model, ids, 3, batch_size=2, target="hidden")  # the last batch is short
    assert rows.shape == (3, 3, 9) and positions.tolist() == [3, 5, 8]
    for s in range(3):
        for k, q in enumerate(positions):
            np.testing.assert_allclose(rows[s, k], _oracle(model, ids[s], int(q)), rtol=1e-8, atol=0)
            assert np.all(rows[s, k, q + 1:] == 0) and np.all(rows[s, k, : q + 1] > 0)
    # Sequences are independent: one at a time gives the same numbers.
    single, _ = influence_rows(model, ids, 3, batch_size=1, target="hidden")
    np.testing.assert_allclose(rows, single, rtol=1e-12, atol=0)
    # Basis vectors in chunks of 5 (7 chunks for D = 32, the last short) instead of all 32 at once.
    monkeypatch.setattr(rows_module, "JACOBIAN_BYTES", 5 * 2 * 9 * 32 * 8)
    chunked, _ = influence_rows(model, ids, 3, batch_size=2, target="hidden")
    np.testing.assert_allclose(chunked, rows, rtol=1e-12, atol=0)


@pytest.mark.parametrize("family", ["bloom", "llama"])
def test_the_probability_target_is_unchanged(family):
    model = tiny(family)
    ids = token_ids(2, 8, seed=1)
    default, positions = influence_rows(model, ids, 2, batch_size=2)
    named, _ = influence_rows(model, ids, 2, batch_size=2, target="probability")
    np.testing.assert_array_equal(named, default)
    for s in range(2):
        for k, q in enumerate(positions):
            np.testing.assert_allclose(named[s, k], influence_gradients(model, ids[s], position=int(q)),
                                       rtol=1e-10, atol=1e-14)
    hidden, _ = influence_rows(model, ids, 2, batch_size=2, target="hidden")
    assert not np.allclose(hidden / hidden.sum(-1, keepdims=True), named / named.sum(-1, keepdims=True))


def test_every_family_reads_the_state_its_final_norm_turns_into_the_last_hidden_state():
    from test_families import FAMILIES, tiny as family_model

    ids = token_ids(1, 6, seed=2) % 61
    for family in FAMILIES:
        model = family_model(family)
        module, before = final_norm(model)
        assert before, family
        captured = []
        handle = module.register_forward_pre_hook(lambda _module, args: captured.append(args[0]))
        with torch.no_grad(), full_precision(model):
            out = model(torch.as_tensor(ids), use_cache=False, output_hidden_states=True)
            handle.remove()
            # The hooked module is the one that makes the model's last (post-norm) hidden state.
            np.testing.assert_allclose(module(captured[0]).numpy(), out.hidden_states[-1].numpy(),
                                       rtol=1e-12, atol=1e-12, err_msg=family)
        rows, _ = influence_rows(model, ids, [5], target="hidden")
        assert np.all(np.isfinite(rows)) and rows[0, 0, -1] > 0, family


def test_a_model_without_final_norm_reads_the_last_block_output():
    config = transformers.OPTConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=16, ffn_dim=24,
                                    vocab_size=61, max_position_embeddings=32, word_embed_proj_dim=16,
                                    do_layer_norm_before=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").double().eval()
    module, before = final_norm(model)
    assert not before and module is model.model.decoder.layers[-1]
    ids = token_ids(2, 6, seed=4) % 61
    rows, _ = influence_rows(model, ids, [3, 5], target="hidden")
    for s in range(2):  # no norm to remove: the returned last hidden state is the last block's output
        np.testing.assert_allclose(rows[s, 1], _oracle(model, ids[s], 5), rtol=1e-8, atol=0)


def test_an_unknown_target_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^target: got 'logit'; allowed: probability, hidden$"):
        influence_rows(tiny("bloom"), token_ids(1, 4), 1, target="logit")


def test_cli_row_target_writes_hidden_rows_and_records_the_target(tmp_path, capsys):
    from jaxroll.measure import read_measurement

    model_dir = save_tiny(tmp_path / "model", transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=16,
                                                                       vocab_size=64))
    texts = word_texts(tmp_path / "docs.txt", [14, 14])
    capsys.readouterr()  # save_pretrained's progress
    base = ["measure", model_dir, "--texts", texts, "--length", 10, "--samples", 2, "--quiet", "--dtype", "float64",
            "--stats", "influence"]
    for bad, word in ((["--queries", 2, "--row-target", "logit"], "row-target"), (["--row-target", "hidden"],
                                                                                   "without --queries")):
        code, _, err = run_cli(base + ["--out", tmp_path / "bad"] + bad, capsys)
        assert code == 2 and word in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "bad").exists()
    code, _, err = run_cli(base + ["--out", tmp_path / "hidden", "--queries", 2, "--row-target", "hidden"], capsys)
    assert code == 0, err
    arrays, metadata = read_measurement(tmp_path / "hidden")
    assert metadata["row_target"] == "hidden" and metadata["queries"] == [4, 9]
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64)
    rows = arrays["influence_rows_per_sequence"]
    assert rows.shape == (2, 2, 10) and np.all(rows[:, 0, 5:] == 0)
    expected, _ = influence_rows(model, arrays["token_ids"], [4, 9], target="hidden")
    np.testing.assert_allclose(rows, expected, rtol=1e-10, atol=0)
    code, _, err = run_cli(base + ["--out", tmp_path / "default", "--queries", 2], capsys)
    assert code == 0, err
    arrays, metadata = read_measurement(tmp_path / "default")
    assert metadata["row_target"] == "probability"
    np.testing.assert_allclose(arrays["influence_rows_per_sequence"][:, -1], arrays["influence_per_sequence"],
                               rtol=1e-10, atol=1e-14)
