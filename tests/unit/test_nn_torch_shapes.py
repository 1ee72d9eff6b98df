"""TorchNetwork on outputs of any shape (psrv.nn.torch_shapes): a scalar head (n,), a segmentation map
(n, C, H, W), a per-step tagger and a sequence classifier (n, T, k) with masks. Each is compared with
plain torch on the same rows; masked steps provably contribute nothing (other padding, same loss and
gradients); evaluation is per position with the masked ones dropped; inference keeps the module's shape."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.nn import DataSet, TorchNetwork  # noqa: E402
from psrv.nn.errors import ConfigError, InvalidInputError  # noqa: E402
from psrv.nn.evaluation import Evaluation, RegressionEvaluation  # noqa: E402


class Scalar(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def forward(self, x):
        return self.layers(x).squeeze(1)  # (n,)


class Segmenter(torch.nn.Module):
    """(n, 1, 6, 6) images to (n, 2, 6, 6) logits: is the pixel brighter than 0.5."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(),
                                          torch.nn.Conv2d(8, 2, 1))

    def forward(self, x):
        return self.layers(x)


class Tagger(torch.nn.Module):
    """(n, T, 3) to (n, T, 3) logits, left to right: needs no features mask."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 12, batch_first=True)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


class LastStep(torch.nn.Module):
    """A sequence classifier of variable lengths: the hidden state at each sequence's last real step."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(2, 12, batch_first=True)
        self.head = torch.nn.Linear(12, 2)
        self.seen_masks = 0

    def forward(self, x, mask=None):
        hidden = self.lstm(x)[0]
        if mask is None:
            return self.head(hidden[:, -1])
        self.seen_masks += 1
        last = mask.sum(dim=1).long().clamp(min=1) - 1
        return self.head(hidden[torch.arange(x.shape[0]), last])


def _net(module, loss, shape, seed=5, **kwargs) -> TorchNetwork:
    torch.manual_seed(seed)
    kwargs.setdefault("optimizer", lambda ps: torch.optim.Adam(ps, lr=1e-2))
    return TorchNetwork(module(), loss, input_shape=shape, seed=seed, **kwargs)


def _sequences(rng: np.random.Generator, n: int, steps: int, width: int, pad: float = 0.0):
    """Padded (n, T, width) features with variable lengths, their (n, T) mask, padding set to ``pad``."""
    lengths = rng.integers(2, steps + 1, size=n)
    lengths[0] = steps
    mask = (np.arange(steps)[None, :] < lengths[:, None]).astype(np.float32)
    x = rng.normal(size=(n, steps, width)).astype(np.float32)
    x[mask == 0] = pad
    return x, mask


def test_a_scalar_head_trains_and_predicts_in_its_own_shape() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)  # (n,)
    net = _net(Scalar, torch.nn.MSELoss(), (3,), output_activation=None)
    assert net.num_outputs == 1 and net.layout.output_shapes == ((),)
    reference = Scalar()
    reference.load_state_dict(net.module.state_dict())
    _, loss = net.compute_gradient(x[:32], y[:32])
    expected = torch.nn.functional.mse_loss(reference(torch.from_numpy(x[:32])).detach(),
                                            torch.from_numpy(y[:32]))
    assert loss == pytest.approx(float(expected), rel=1e-6)
    before = net.score(DataSet(x, y))
    net.fit(DataSet(x, y), epochs=20, batch_size=32)
    assert net.score(DataSet(x, y)) < 0.05 * before
    out = net.output(x[:10])
    assert out.shape == (10,)
    np.testing.assert_array_equal(net.predict(x[:10]), out)
    result = net.evaluate(DataSet(x, y))
    assert isinstance(result, RegressionEvaluation)
    assert result.mean_squared_error() == pytest.approx(float(np.mean((net.output(x) - y) ** 2)), rel=1e-4)


def test_softmax_or_index_targets_on_a_scalar_head_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"output_activation='softmax' needs a class axis.*\(n,\)"):
        _net(Scalar, torch.nn.MSELoss(), (3,))
    with pytest.raises(ConfigError, match=r"targets='index' needs a class axis"):
        _net(Scalar, torch.nn.MSELoss(), (3,), output_activation=None, targets="index")


def test_a_segmentation_model_trains_on_pixel_class_indices() -> None:
    rng = np.random.default_rng(1)
    x = rng.random((96, 1, 6, 6), dtype=np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)  # (n, H, W) class indices: the class axis 1 removed
    net = _net(Segmenter, torch.nn.CrossEntropyLoss(), (1, 6, 6))
    assert net.num_outputs == 2 and net.layout.class_axes == (1,)
    reference = Segmenter()
    reference.load_state_dict(net.module.state_dict())
    _, loss = net.compute_gradient(x[:16], y[:16])
    logits = reference(torch.from_numpy(x[:16])).detach()
    expected = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y[:16]))
    assert loss == pytest.approx(float(expected), rel=1e-5)
    net.fit(DataSet(x, y), epochs=15, batch_size=16)
    out = net.output(x[:4])
    assert out.shape == (4, 2, 6, 6)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)  # softmax over the class axis
    predicted = net.predict(x)
    assert predicted.shape == (96, 6, 6)
    evaluation = net.evaluate(DataSet(x, y))  # one row per pixel
    assert int(evaluation.confusion_matrix().sum()) == 96 * 36
    assert evaluation.accuracy() == pytest.approx(float(np.mean(predicted == y)))
    assert evaluation.accuracy() > 0.95
    # a per-pixel mask removes pixels from the loss and from the evaluation
    keep = np.zeros((96, 6, 6), np.float32)
    keep[:, :3] = 1
    masked = net.evaluate(DataSet(x, y, labels_mask=keep))
    assert int(masked.confusion_matrix().sum()) == 96 * 18
    assert masked.accuracy() == pytest.approx(float(np.mean((predicted == y)[:, :3])))


def _tagger_data(seed: int, n: int = 48, steps: int = 7, pad: float = 0.0):
    rng = np.random.default_rng(seed)
    x, mask = _sequences(rng, n, steps, 3, pad)
    tags = x.argmax(axis=2)  # the tag of a step: its largest feature
    return x, tags, mask


def test_a_tagger_loss_is_the_mean_over_unmasked_steps() -> None:
    x, tags, mask = _tagger_data(2)
    net = _net(Tagger, torch.nn.CrossEntropyLoss(), (None, 3))
    reference = Tagger()
    reference.load_state_dict(net.module.state_dict())
    _, loss = net.compute_gradient(x, tags, mask)
    logits = reference(torch.from_numpy(x)).detach()  # (n, T, k): torch wants (n, k, T)
    per = torch.nn.functional.cross_entropy(logits.transpose(1, 2), torch.from_numpy(tags), reduction="none")
    expected = float((per * torch.from_numpy(mask)).sum() / mask.sum())
    assert loss == pytest.approx(expected, rel=1e-5)
    one_hot = np.eye(3, dtype=np.float32)[tags]  # (n, T, k) labels: the same loss
    assert net.compute_gradient(x, one_hot, mask)[1] == pytest.approx(loss, rel=1e-6)


def test_masked_steps_contribute_nothing_to_the_loss_or_the_gradients() -> None:
    x, tags, mask = _tagger_data(3)
    other_x, _, _ = _tagger_data(3, pad=1e3)
    other_tags = np.where(mask == 1, tags, 2 - tags)  # other labels on the padding too
    assert not np.array_equal(x, other_x) and not np.array_equal(tags, other_tags)
    net = _net(Tagger, torch.nn.CrossEntropyLoss(), (None, 3))
    grad, loss = net.compute_gradient(x, tags, mask)
    other_grad, other_loss = net.compute_gradient(other_x, other_tags, mask)
    assert other_loss == loss
    np.testing.assert_array_equal(other_grad, grad)
    unmasked_grad, _ = net.compute_gradient(other_x, other_tags)  # without the mask it does change
    assert not np.allclose(unmasked_grad, grad)
    # the same through the sequence classifier, whose module reads the features mask
    rng = np.random.default_rng(4)
    seq_x, seq_mask = _sequences(rng, 32, 6, 2)
    labels = (np.sum(seq_x[:, :, 0], axis=1) > 0).astype(np.int64)
    classifier = _net(LastStep, torch.nn.CrossEntropyLoss(), (None, 2))
    grad, loss = classifier.compute_gradient(seq_x, labels, features_mask=seq_mask)
    padded = np.where(seq_mask[:, :, None] == 1, seq_x, -7.0).astype(np.float32)
    other_grad, other_loss = classifier.compute_gradient(padded, labels, features_mask=seq_mask)
    assert other_loss == loss and classifier.module.seen_masks == 2
    np.testing.assert_array_equal(other_grad, grad)


def test_a_masked_tagger_trains_evaluates_per_step_and_infers_in_its_shape() -> None:
    x, tags, mask = _tagger_data(5, n=160, steps=8)
    one_hot = np.eye(3, dtype=np.float32)[tags] * mask[:, :, None]  # the pipeline's zero-padded labels
    data = DataSet(x, one_hot, mask, mask.copy())
    net = _net(Tagger, torch.nn.CrossEntropyLoss(), (None, 3))
    net.fit(data, epochs=12, batch_size=16)
    evaluation = net.evaluate(data)
    assert isinstance(evaluation, Evaluation)
    probabilities = net.output(x)
    assert probabilities.shape == x.shape[:2] + (3,)
    rows = mask.reshape(-1) == 1
    expected = Evaluation(num_classes=3)
    expected.eval(one_hot.reshape(-1, 3)[rows], probabilities.reshape(-1, 3)[rows])
    np.testing.assert_array_equal(evaluation.confusion_matrix(), expected.confusion_matrix())
    assert int(evaluation.confusion_matrix().sum()) == int(mask.sum())  # the masked steps dropped
    assert evaluation.accuracy() > 0.9
    assert net.predict(x).shape == tags.shape
    masked = net.output(x, mask=mask)  # inference with a features mask: the padding predicts zeros
    np.testing.assert_array_equal(masked[mask == 0], 0.0)
    np.testing.assert_array_equal(masked[mask == 1], probabilities[mask == 1])


def test_a_sequence_classifier_of_variable_lengths_trains_from_datasets() -> None:
    rng = np.random.default_rng(6)
    batches = []
    for steps in (4, 6, 9):  # batches of different lengths, each padded to its own longest
        x, mask = _sequences(rng, 64, steps, 2)
        labels = (np.sum(x[:, :, 0], axis=1) > 0).astype(np.int64)
        batches.append(DataSet(x, np.eye(2, dtype=np.float32)[labels], features_mask=mask))
    net = _net(LastStep, torch.nn.CrossEntropyLoss(), (None, 2))
    before = net.evaluate(batches).accuracy()
    net.fit(batches, epochs=25)
    after = net.evaluate(batches)
    assert after.accuracy() > max(0.9, before), (before, after.accuracy())
    assert net.module.seen_masks > 0
    assert net.output(batches[0].features, mask=batches[0].features_mask).shape == (64, 2)


def test_labels_and_masks_of_the_wrong_shape_are_named() -> None:
    x, tags, mask = _tagger_data(7, n=4, steps=5)
    net = _net(Tagger, torch.nn.CrossEntropyLoss(), (None, 3))
    with pytest.raises(InvalidInputError, match=r"shape \(4, 5, 3\).*class indices of shape \(4, 5\)"):
        net.compute_update(x, tags[:, :4])
    with pytest.raises(InvalidInputError, match=r"class indices in \[0, 2\]"):
        net.compute_update(x, tags + 3)
    with pytest.raises(InvalidInputError, match=r"mask: expected shape \(4,\) per example, \(4, 5\) per"):
        net.compute_update(x, tags, mask[:, :3])
    with pytest.raises(InvalidInputError, match=r"features: expected shape \(n, None, 3\)"):
        net.compute_update(x[:, :, :2], tags)


def test_the_driver_checks_a_sample_against_the_output_shape() -> None:
    from psrv.spark.driver.preflight import check_sample
    from psrv.spark.errors import SparkInputError

    x, tags, mask = _tagger_data(8, n=4, steps=5)
    tagger = _net(Tagger, torch.nn.CrossEntropyLoss(), (None, 3))
    check_sample(tagger, DataSet(x, np.eye(3, dtype=np.float32)[tags], mask, mask))  # (T, k) labels fit
    check_sample(tagger, DataSet(x, tags.astype(np.float32), mask, mask))  # (T,) class indices fit
    with pytest.raises(SparkInputError, match=r"labels have shape \(5, 4\) .* outputs \(n, T, 3\)"):
        check_sample(tagger, DataSet(x, np.zeros((4, 5, 4), np.float32)))
    segmenter = _net(Segmenter, torch.nn.CrossEntropyLoss(), (1, 6, 6))
    images = np.zeros((2, 1, 6, 6), np.float32)
    check_sample(segmenter, DataSet(images, np.zeros((2, 6, 6), np.float32)))
    with pytest.raises(SparkInputError, match=r"outputs \(n, 2, 6, 6\)"):
        check_sample(segmenter, DataSet(images, np.zeros((2, 5, 5), np.float32)))


def test_a_sequence_batch_round_trips_through_the_parquet_minibatch_format() -> None:
    import io

    pytest.importorskip("pyarrow")
    from psrv.spark.data.parquet import dataset_from_parquet, dataset_to_parquet

    x, tags, mask = _tagger_data(9, n=5, steps=4)
    batch = DataSet(x, np.eye(3, dtype=np.float32)[tags], mask, mask.copy())
    back = dataset_from_parquet(io.BytesIO(dataset_to_parquet(batch)), "mem")
    assert back.equals(batch)
    plain = DataSet(x, tags.astype(np.float32))
    assert dataset_from_parquet(io.BytesIO(dataset_to_parquet(plain)), "mem").equals(plain)


def test_a_per_example_mask_gives_the_mean_over_the_kept_examples() -> None:
    rng = np.random.default_rng(10)
    x = rng.normal(size=(12, 2, 3)).astype(np.float32)
    y = rng.integers(0, 3, size=12)
    keep = (np.arange(12) % 3 != 0).astype(np.float32)  # (n,): whole sequences in or out
    net = _net(Tagger, torch.nn.CrossEntropyLoss(), (2, 3))
    _, masked = net.compute_gradient(x, np.repeat(y[:, None], 2, axis=1), keep)
    _, kept = net.compute_gradient(x[keep == 1], np.repeat(y[keep == 1, None], 2, axis=1))
    assert masked == pytest.approx(kept, rel=1e-6)


def test_the_network_and_the_evaluations_flatten_time_steps_the_same_way() -> None:
    """One home for flattening: the network's evaluation rows of a (n, T, k) output with a step mask are
    the evaluations' own time-series rows, and a (n, C, H, W) map gives one row per pixel, classes last."""
    from psrv.nn.eval_common import flatten_time
    from psrv.nn.torch_shapes import evaluation_rows

    rng = np.random.default_rng(3)
    labels, output = rng.random((4, 5, 3)), rng.random((4, 5, 3))
    mask = (rng.random((4, 5)) > 0.4).astype(np.float32)
    ours = evaluation_rows(labels, output, mask, 2)
    theirs = flatten_time(labels, output, mask, sequence_ndim=3)
    for a, b in zip(ours[:2], theirs[:2], strict=True):
        np.testing.assert_array_equal(a, b)
    assert ours[2] is None and theirs[2] is None and ours[1].shape == (int(mask.sum()), 3)

    maps = rng.random((2, 3, 4, 4))
    rows_y, rows_p, rows_m = evaluation_rows(maps, maps, np.array([1.0, 0.0]), 1)
    np.testing.assert_array_equal(rows_p, np.moveaxis(maps[:1], 1, -1).reshape(-1, 3))
    assert rows_m is None and rows_y.shape == (16, 3)
