"""The placement search's one-dimensional searches: golden-section argmin and bisection."""

from __future__ import annotations

import pytest

from slide_ir.planning.integer_search import argmin_unimodal, last_true


@pytest.mark.parametrize("lo", [0, 3])
@pytest.mark.parametrize("width", [0, 1, 2, 3, 4, 7, 20, 34])
def test_argmin_finds_the_minimum_of_a_unimodal_function(lo, width):
    hi = lo + width
    for m in range(lo, hi + 1):
        values = {x: abs(x - m) * (1.0 if x < m else 2.5) for x in range(lo, hi + 1)}
        assert argmin_unimodal(values.__getitem__, lo, hi) == m
    flat = argmin_unimodal(lambda x: 1.0, lo, hi)  # ties: the smallest
    assert flat == lo


def test_last_true_bisects_a_falling_predicate():
    assert last_true(lambda x: x <= 6, 0, 10) == 6
    assert last_true(lambda x: x <= 60, 0, 10) == 10
    assert last_true(lambda x: x < 0, 0, 10) is None
