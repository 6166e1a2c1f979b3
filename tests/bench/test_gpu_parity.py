"""bench/kernels/gpu_parity.py's parts on the CPU: the copy-task batches, the error measures and the
plain PyTorch loop it compares the executor with."""

from __future__ import annotations

import torch

from bench.kernels.gpu_parity import (
    copy_task,
    plain_loop,
    random_model,
    weight_error,
    within_bf16_noise,
)

TINY = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "attention_dropout": 0.0,
}


def test_copy_task_repeats_a_motif_and_shifts_the_labels():
    batches = copy_task(active=100, batch=3, seq=40, steps=2, motif=8)
    assert len(batches) == 2
    ids, labels = batches[0]
    assert ids.shape == labels.shape == (3, 40)
    assert torch.equal(ids[:, 1:], labels[:, :-1])
    assert torch.equal(ids[:, :8], ids[:, 8:16])
    assert not torch.equal(batches[0][0], batches[1][0])
    assert int(ids.max()) < 100


def test_weight_error_is_relative_to_how_far_training_moved():
    init = {"w": torch.zeros(4)}
    gold = {"w": torch.full((4,), 2.0)}
    assert weight_error(gold, gold, init) == 0.0
    assert abs(weight_error({"w": torch.full((4,), 2.2)}, gold, init) - 0.1) < 1e-6


def test_within_bf16_noise_allows_twice_the_reference_error():
    assert within_bf16_noise((0.02, 0.2), (0.01, 0.1))
    assert not within_bf16_noise((0.0211, 0.05), (0.01, 0.1))
    assert not within_bf16_noise((0.001, 0.25), (0.01, 0.1))


def test_plain_loop_learns_and_bf16_differs_from_fp32():
    batches = copy_task(active=16, batch=2, seq=32, steps=6, motif=8)
    init = {k: v.clone() for k, v in random_model(TINY).state_dict().items()}
    losses, gold = plain_loop(lambda: random_model(TINY), batches, torch.float32, 1e-2, "cpu")
    again, same = plain_loop(lambda: random_model(TINY), batches, torch.float32, 1e-2, "cpu")
    _, bf16 = plain_loop(lambda: random_model(TINY), batches, torch.bfloat16, 1e-2, "cpu")
    assert losses == again and weight_error(same, gold, init) == 0.0
    assert losses[-1] < losses[0]
    assert 0.0 < weight_error(bf16, gold, init) < 1.0
