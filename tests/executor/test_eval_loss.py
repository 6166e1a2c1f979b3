"""The eval loss: forward-only passes of the Program between training passes (CPU mode).

Each eval's loss is the mean token cross-entropy of the transformers model holding the weights
trained so far (the reference loop's, after as many steps) on the same eval batches; and a run
that evaluates after every step ends with bitwise the weights and losses of one that never does.
"""

from __future__ import annotations

import pytest
import torch
from hf_models import hf_model
from runs import LR, STEPS, B, S, assert_bitwise_equal, model_config, run_executor
from runs import batches as train_batches

from executor.evaluation import Eval
from executor.reference_loop import reference_train

EVAL_BATCHES = 3
# the eval loss against transformers' forward on weights trained the same way: the training
# parity's tolerance (runs.RTOL, from the fused q/k/v and gate/up matmuls), twice over
RTOL = 2e-5


def eval_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three batches unlike the training data, the last with a padded-out row (labels -100)."""
    out = []
    g = torch.Generator().manual_seed(1234)
    for i in range(EVAL_BATCHES):
        ids = torch.randint(0, 512, (B, S), generator=g)
        labels = torch.randint(0, 512, (B, S), generator=g)
        if i == EVAL_BATCHES - 1:
            labels[1:] = -100
        out.append((ids, labels))
    return out


def hf_eval_loss(tied: bool, steps: int) -> float:
    """Mean token cross-entropy on `eval_batches` of the reference model after `steps` steps."""
    model = hf_model(model_config(tied))
    reference_train(model, train_batches(steps), lr=LR)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for ids, labels in eval_batches():
            logits = model(input_ids=ids).logits.float().flatten(0, 1)  # (B*S, V)
            total += float(
                torch.nn.functional.cross_entropy(logits, labels.flatten(), reduction="sum")
            )
            tokens += int((labels != -100).sum())
    return total / tokens


def run_with_eval(tied: bool, every: int, **config: object) -> tuple[object, dict[int, float]]:
    seen: dict[int, float] = {}

    def on_eval(step: int, loss: float, figures: dict) -> None:
        assert figures["eval_batches"] == EVAL_BATCHES
        seen[step] = loss

    ev = Eval(every=every, batches=EVAL_BATCHES, data=lambda: iter(eval_batches()), on_eval=on_eval)
    return run_executor(tied, train_kwargs={"evaluate": ev}, **config), seen


PLACEMENTS = [
    pytest.param(False, {}, id="sliding"),
    pytest.param(True, {"placement": "fast", "resident": 2, "streamed": 1}, id="tied-mixed"),
]


@pytest.mark.parametrize(("tied", "config"), PLACEMENTS)
def test_eval_loss_is_transformers_forward_after_the_steps_trained(
    tied: bool, config: dict
) -> None:
    _, seen = run_with_eval(tied, every=4, **config)
    assert sorted(seen) == [4, 8, STEPS]  # every 4th step, and the last
    for step, loss in seen.items():
        want = hf_eval_loss(tied, step)
        assert abs(loss - want) <= RTOL * want, f"after step {step}: {loss} vs {want}"


@pytest.mark.parametrize(("tied", "config"), PLACEMENTS)
def test_an_eval_after_every_step_leaves_the_training_bitwise_alone(
    tied: bool, config: dict
) -> None:
    with_eval, seen = run_with_eval(tied, every=1, **config)
    assert sorted(seen) == list(range(1, STEPS + 1))
    assert_bitwise_equal(with_eval, run_executor(tied, **config))
