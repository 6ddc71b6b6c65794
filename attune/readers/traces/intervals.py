"""Interval arithmetic on numpy arrays: unions, overlaps and layered attribution over windows.

An interval set is a pair of float arrays ``(starts, ends)``. ``merge`` turns any set into a
sorted, disjoint one (intervals that touch are merged, as HTA merges them). Every other function
takes merged sets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["EMPTY", "Intervals", "attribute", "intersection_length", "length", "merge", "subtract"]

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.empty(0), np.empty(0))


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Union of intervals as a sorted disjoint set."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = np.maximum(ends[order], s)
    run_end = np.maximum.accumulate(e)
    new_group = np.empty(s.size, dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > run_end[:-1]
    first = np.flatnonzero(new_group)
    last = np.append(first[1:], s.size) - 1
    return s[first], run_end[last]


def length(iv: Intervals) -> float:
    return float(np.sum(iv[1] - iv[0])) if iv[0].size else 0.0


def _covered(iv: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For elementary segments [lo, hi) that never straddle a boundary of ``iv``: inside ``iv``?"""
    ms, me = iv
    if ms.size == 0:
        return np.zeros(lo.size, dtype=bool)
    idx = np.searchsorted(ms, lo, side="right") - 1
    ok = idx >= 0
    return ok & (me[np.clip(idx, 0, None)] >= hi)


def _segments(sets: Sequence[Intervals], extra: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, np.ndarray]:
    parts = [a for iv in sets for a in iv] + list(extra)
    bounds = np.unique(np.concatenate(parts)) if parts else np.empty(0)
    return bounds[:-1], bounds[1:]


def intersection_length(a: Intervals, b: Intervals) -> float:
    if a[0].size == 0 or b[0].size == 0:
        return 0.0
    lo, hi = _segments([a, b])
    both = _covered(a, lo, hi) & _covered(b, lo, hi)
    return float(np.sum((hi - lo)[both]))


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """``a`` minus ``b``, merged."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    lo, hi = _segments([a, b])
    keep = _covered(a, lo, hi) & ~_covered(b, lo, hi)
    return merge(lo[keep], hi[keep])


def attribute(
    layers: Sequence[Intervals], win_starts: np.ndarray, win_ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Split each window's time among layers by priority.

    Returns ``(exclusive, inclusive)``. ``exclusive[w, i]`` is the time in window ``w`` covered
    by layer ``i`` and by no layer before it; ``exclusive[w, -1]`` is the time covered by no
    layer, so each row sums to the window's length. ``inclusive[w, i]`` is all the time layer
    ``i`` covers in window ``w``. Windows must not overlap.
    """
    n_layers = len(layers)
    win_starts = np.asarray(win_starts, dtype=np.float64)
    win_ends = np.asarray(win_ends, dtype=np.float64)
    n_win = win_starts.size
    exclusive = np.zeros((n_win, n_layers + 1))
    inclusive = np.zeros((n_win, n_layers))
    if n_win == 0:
        return exclusive, inclusive
    order = np.argsort(win_starts)
    ws, we = win_starts[order], win_ends[order]
    lo, hi = _segments(list(layers), [ws, we])
    if lo.size == 0:
        exclusive[:, -1] = win_ends - win_starts
        return exclusive, inclusive
    w = np.searchsorted(ws, lo, side="right") - 1
    valid = w >= 0
    valid &= hi <= we[np.clip(w, 0, None)]
    lo, hi, w = lo[valid], hi[valid], w[valid]
    seg = hi - lo
    label = np.full(lo.size, n_layers, dtype=np.int64)
    for i in range(n_layers - 1, -1, -1):
        cov = _covered(layers[i], lo, hi)
        inclusive[:, i] = np.bincount(w, weights=seg * cov, minlength=n_win)[:n_win]
        label[cov] = i
    flat = np.bincount(w * (n_layers + 1) + label, weights=seg, minlength=n_win * (n_layers + 1))
    exclusive_sorted = flat.reshape(n_win, n_layers + 1)
    # back to the caller's window order
    exclusive[order] = exclusive_sorted
    inclusive_sorted = inclusive.copy()
    inclusive[order] = inclusive_sorted
    return exclusive, inclusive
