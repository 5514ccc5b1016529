"""analysis/read/_matrix.py: the median the analyzers take over ranks and steps."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rankscope.analysis.read._matrix import nanmedian


def _numpy(values: np.ndarray, axis: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        return np.asarray(np.nanmedian(values, axis=axis))


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=9),
        elements=st.one_of(
            st.floats(-1e6, 1e6, allow_nan=False), st.just(np.nan), st.sampled_from([0.0, 1.5])
        ),
    ),
    st.sampled_from([0, 1]),
)
def test_the_same_figures_as_numpy(values: np.ndarray, axis: int) -> None:
    np.testing.assert_array_equal(nanmedian(values, axis), _numpy(values, axis))


@pytest.mark.parametrize("axis", [0, 1])
def test_the_same_figures_as_numpy_where_numpy_goes_column_by_column(axis: int) -> None:
    # numpy's own path differs from 600 values an axis on, where there is a NaN.
    rng = np.random.default_rng(1)
    values = rng.lognormal(3.0, 0.5, size=(700, 40) if axis == 0 else (40, 700))
    values[rng.random(values.shape) < 0.05] = np.nan
    if axis == 0:
        values[:, 3] = np.nan  # a step no rank sampled
    else:
        values[3] = np.nan
    np.testing.assert_array_equal(nanmedian(values, axis), _numpy(values, axis))
    assert np.isnan(nanmedian(values, axis)[3])
