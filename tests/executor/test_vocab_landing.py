"""The embedding's and the head's gradients landing in one shared pinned slot train bit for bit
as with a slot each (today's layout before the sharing, rebuilt here by planning each unit's
landing on its own), and as the plain PyTorch AdamW loop within its tolerance."""

from __future__ import annotations

import pytest
from runs import assert_bitwise_equal, assert_matches_reference, graph_of, run_executor

from slide_ir.ir.graph import PoolRole
from slide_ir.planning import transfer_terms

CASES = {"sliding": {}, "grad-accum-2": {"grad_accum": 2},
         "cast": {"host_weights": "cast"}, "nvme-moments": {"optimizer": "nvme-moments",
                                                            "drives": 1}}  # fmt: skip


def _landing_pools(**config: object) -> dict[str, tuple[int, ...]]:
    graph = graph_of(False, **config)
    return {p.name: p.units for p in graph.pools if p.role == PoolRole.GRAD_LANDING}


@pytest.fixture
def slot_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan the embedding's and the head's landing one unit at a time: a slot each."""
    shared = transfer_terms.vocab_landing_terms

    def separate(terms, model, config, units):  # type: ignore[no-untyped-def]
        for unit in units:
            shared(terms, model, config, [unit])

    monkeypatch.setattr(transfer_terms, "vocab_landing_terms", separate)


@pytest.mark.parametrize("case", sorted(CASES))
def test_shared_vocab_landing_trains_bitwise_as_a_slot_each(case: str, request) -> None:  # type: ignore[no-untyped-def]
    config = CASES[case]
    n = 4  # model_config's layers
    assert _landing_pools(**config)["pinned_grads_vocab"] == (0, n + 1)
    shared = run_executor(False, **config)
    assert_matches_reference(shared, False, config)
    request.getfixturevalue("slot_each")
    pools = _landing_pools(**config)
    assert pools["pinned_grads_embed"] == (0,) and pools["pinned_grads_head"] == (n + 1,)
    assert_bitwise_equal(shared, run_executor(False, **config))
