"""Interval arithmetic against a brute-force reference on a fine integer grid."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from attune.readers.traces import intervals as iv

GRID = 60
_iv = st.lists(st.tuples(st.integers(0, GRID), st.integers(0, 15)), max_size=12)


def _mask(pairs) -> np.ndarray:
    m = np.zeros(GRID + 16, dtype=bool)
    for s, d in pairs:
        m[s : s + d] = True
    return m


def _set(pairs) -> iv.Intervals:
    s = np.array([p[0] for p in pairs], dtype=float)
    e = np.array([p[0] + p[1] for p in pairs], dtype=float)
    return iv.merge(s, e)


@settings(max_examples=200, deadline=None)
@given(a=_iv, b=_iv)
def test_merge_subtract_intersect(a, b):
    ma, mb = _mask(a), _mask(b)
    A, B = _set(a), _set(b)
    assert iv.length(A) == ma.sum()
    assert np.all(A[0][1:] > A[1][:-1])  # disjoint and sorted, touching intervals merged
    assert iv.intersection_length(A, B) == (ma & mb).sum()
    assert iv.length(iv.subtract(A, B)) == (ma & ~mb).sum()


@settings(max_examples=200, deadline=None)
@given(layers=st.lists(_iv, min_size=1, max_size=4), cuts=st.lists(st.integers(0, GRID + 16), min_size=2, max_size=5, unique=True))
def test_attribute_is_a_partition_by_priority(layers, cuts):
    cuts = sorted(cuts)
    ws, we = np.array(cuts[:-1], dtype=float), np.array(cuts[1:], dtype=float)
    excl, incl = iv.attribute([_set(layer) for layer in layers], ws, we)
    masks = [_mask(layer) for layer in layers]
    excl_r, incl_r = iv.attribute([_set(layer) for layer in layers], ws[::-1], we[::-1])
    assert np.array_equal(excl_r, excl[::-1]) and np.array_equal(incl_r, incl[::-1])
    for w, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        taken = np.zeros(GRID + 16, dtype=bool)
        window = np.zeros(GRID + 16, dtype=bool)
        window[lo:hi] = True
        for i, m in enumerate(masks):
            assert incl[w, i] == (m & window).sum()
            assert excl[w, i] == (m & window & ~taken).sum()
            taken |= m
        assert excl[w, -1] == (window & ~taken).sum()
        assert excl[w].sum() == hi - lo
