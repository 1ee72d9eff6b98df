"""Normalizers: fitted statistics, streaming fit, transforms, saved state."""

from __future__ import annotations

import json

import numpy as np
import pytest
from psrv.nn.data import DataSet
from psrv.nn.errors import NormalizerError
from psrv.nn.normalizers import ImageScaler, MinMax, Standardize, normalizer_from_state
from sklearn.preprocessing import MinMaxScaler, StandardScaler


def _data(n: int = 200, seed: int = 0) -> DataSet:
    rng = np.random.default_rng(seed)
    features = (rng.standard_normal((n, 5)) * [1, 10, 0.1, 3, 7] + [0, 5, -2, 100, 1]).astype(np.float32)
    labels = rng.standard_normal((n, 2)) * 4 + 3
    return DataSet(features, labels)


def test_standardize_matches_sklearn_and_streams() -> None:
    ds = _data()
    whole = Standardize().fit(ds)
    streamed = Standardize().fit(ds.batches(13))
    expected = StandardScaler().fit_transform(ds.features.astype(np.float64))
    out = whole.transform(ds)
    assert out.features.dtype == np.float32
    np.testing.assert_allclose(out.features, expected, atol=1e-5)
    np.testing.assert_allclose(streamed.feature_mean, whole.feature_mean, rtol=1e-12)
    np.testing.assert_allclose(streamed.feature_std, whole.feature_std, rtol=1e-10)
    np.testing.assert_array_equal(out.labels, ds.labels)  # labels untouched without fit_labels


def test_minmax_matches_sklearn_and_reverts_labels() -> None:
    ds = _data()
    norm = MinMax(-1.0, 1.0, fit_labels=True).fit(ds.batches(50))
    expected = MinMaxScaler((-1, 1)).fit_transform(ds.features.astype(np.float64))
    out = norm.transform(ds)
    np.testing.assert_allclose(out.features, expected, atol=1e-5)
    assert out.labels.min() == pytest.approx(-1.0) and out.labels.max() == pytest.approx(1.0)
    np.testing.assert_allclose(norm.revert_labels(out.labels), ds.labels, rtol=1e-10)


def test_constant_feature_does_not_divide_by_zero() -> None:
    ds = DataSet(np.column_stack([np.full(10, 3.0), np.arange(10.0)]), np.zeros((10, 1)))
    for norm in (Standardize(), MinMax()):
        out = norm.fit(ds).transform(ds)
        assert np.all(np.isfinite(out.features))
        np.testing.assert_allclose(out.features[:, 0], 0.0)


def test_image_scaler_maps_0_255_to_unit_range() -> None:
    pixels = np.array([[0, 51, 255]], dtype=np.uint8)
    out = ImageScaler().fit(DataSet(pixels, np.zeros((1, 1)))).transform(DataSet(pixels, np.zeros((1, 1))))
    np.testing.assert_allclose(out.features, [[0.0, 0.2, 1.0]], rtol=1e-6)
    assert out.features.dtype == np.float32
    np.testing.assert_allclose(ImageScaler(-1, 1).transform_features(pixels), [[-1.0, -0.6, 1.0]], rtol=1e-6)


def test_sequence_statistics_ignore_padding_and_keep_it_zero() -> None:
    features = np.zeros((2, 3, 1), np.float32)
    features[0, :, 0] = [1, 2, 3]
    features[1, :2, 0] = [4, 5]  # step 2 of example 1 is padding
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
    ds = DataSet(features, np.zeros((2, 3, 1)), features_mask=mask)
    norm = Standardize().fit(ds)
    assert norm.feature_mean == pytest.approx([3.0])
    out = norm.transform(ds)
    assert out.features[1, 2, 0] == 0.0
    valid = out.features[mask != 0]
    assert valid.mean() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("make", [lambda: Standardize(fit_labels=True), lambda: MinMax(0, 2), ImageScaler])
def test_state_round_trips_through_json(make) -> None:
    ds = _data()
    norm = make().fit(ds)
    state = json.loads(json.dumps(norm.get_state()))
    again = normalizer_from_state(state)
    assert type(again) is type(norm)
    np.testing.assert_array_equal(again.transform(ds).features, norm.transform(ds).features)
    np.testing.assert_array_equal(again.transform(ds).labels, norm.transform(ds).labels)


def test_use_before_fit_and_bad_state_are_clear_errors() -> None:
    with pytest.raises(NormalizerError, match="before fit"):
        Standardize().transform(_data())
    with pytest.raises(NormalizerError, match="before fit"):
        MinMax().get_state()
    with pytest.raises(NormalizerError, match="unknown type"):
        normalizer_from_state({"type": "Nope"})
    with pytest.raises(NormalizerError, match="version"):
        normalizer_from_state({"type": "ImageScaler", "version": 7})
    with pytest.raises(NormalizerError, match="at least one example"):
        Standardize().fit([])


def test_fit_rejects_nan_and_transform_rejects_wrong_width() -> None:
    bad = DataSet(np.array([[1.0], [np.nan]]), np.zeros((2, 1)))
    with pytest.raises(NormalizerError, match="NaN"):
        Standardize().fit(bad)
    norm = Standardize().fit(_data())
    with pytest.raises(NormalizerError, match=r"trailing shape \(5,\)"):
        norm.transform_features(np.zeros((3, 4)))
