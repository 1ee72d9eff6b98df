"""Lightning's Trainer with psrv's strategy, run as a user would: ``psrv.run`` starts two real worker
processes, each fits a LightningModule with ``Trainer(strategy=PsrvStrategy())`` (AdamW, a cosine
schedule, gradient clipping and accumulation, all Lightning's own). The checks: every replica equals the
master copy after the drain, the master holds each worker's every message once, each rank trained on its
half of the rows (the DistributedSampler), and the master copy learned at least half of what one process
learns with the same module and the same Trainer settings on all the rows. The run here trains in
``bf16-mixed`` precision (Lightning's autocast plugin; on the CPU its ``16-mixed`` is bf16 too), the
Spark run of the same function in full precision.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

import psrv  # noqa: E402
import psrv.torch as pt  # noqa: E402
from own_loop_checks import applied_by_worker  # noqa: E402
from psrv.torch.environment import RENDEZVOUS_ENV  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

ROWS, BATCH, EPOCHS, ACCUMULATE = 2048, 16, 3, 2


def make_rows() -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 10)).astype(np.float32)
    y = (x @ rng.normal(size=(10, 3))).argmax(axis=1)
    return torch.from_numpy(x), torch.from_numpy(y)


class Classifier(L.LightningModule):
    """A small MLP; AdamW with a cosine schedule, as a user's configure_optimizers returns them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
        self.logits_dtypes: set[str] = set()

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self.net(features)
        self.logits_dtypes.add(str(logits.dtype))
        return torch.nn.functional.cross_entropy(logits, labels)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=1e-4)
        steps = EPOCHS * ROWS // BATCH // ACCUMULATE
        return {"optimizer": optimizer,
                "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)}

    def full_loss(self) -> float:
        x, y = make_rows()
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(self.net(x), y))


def fit(strategy, precision: str = "32-true") -> tuple[Classifier, L.Trainer]:
    model = Classifier()
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=EPOCHS,
                        precision=precision, gradient_clip_val=1.0, accumulate_grad_batches=ACCUMULATE,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, DataLoader(TensorDataset(*make_rows()), batch_size=BATCH, shuffle=True))
    return model, trainer


def train_with_psrv(precision: str = "32-true") -> dict:
    strategy = pt.PsrvStrategy()
    model, trainer = fit(strategy, precision)
    return {"steps": trainer.global_step, "batches": trainer.num_training_batches,
            "report": strategy.report, "precision": type(trainer.precision_plugin).__name__,
            "logits_dtypes": sorted(model.logits_dtypes),
            "params_dtype": str(strategy.distributed_optimizer.flat_params.dtype)}


def check_lightning_run(result, precision: str = "32-true") -> None:
    """What a launcher's run of ``train_with_psrv`` on two workers must show (psrv.run's and Spark's)."""
    assert result.value["params_dtype"] == "torch.float32"  # the shared parameters stay full precision
    if precision == "bf16-mixed":  # Lightning's autocast plugin ran the steps
        assert result.value["precision"] == "MixedPrecision", result.value
        assert result.value["logits_dtypes"] == ["torch.bfloat16"]  # every training step autocast
    else:
        assert result.value["logits_dtypes"] == ["torch.float32"]
    shard_batches = ROWS // 2 // BATCH
    assert result.value["batches"] == shard_batches  # rank 0 saw its half of the rows
    assert result.value["steps"] == EPOCHS * shard_batches // ACCUMULATE
    assert result.value["report"]["replica"]["status"] == "equal"  # the strategy left at the end of fit
    applied = {str(k): int(v) for k, v in result.counters["applied_by_origin"].items()}
    for report in result.reports:
        assert report["replica"]["status"] == "equal", report
        assert report["steps"] == result.value["steps"] and report["messages"] > 0
        # every message once, none lost (under each id it held: a rejoin after a stall gets a new one)
        assert applied_by_worker(report, applied) == report["messages"], (report, applied)
    assert sum(applied.values()) == sum(r["messages"] for r in result.reports)

    start = Classifier().full_loss()
    reference, _ = fit("auto", precision)  # one process, all the rows, the same Trainer settings
    shared = result.load_into(Classifier()).full_loss()
    assert shared < start - 0.5 * (start - reference.full_loss()), (start, reference.full_loss(), shared)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_lightning_module_trains_with_the_psrv_strategy_on_two_workers_in_mixed_precision() -> None:
    check_lightning_run(psrv.run(train_with_psrv, "bf16-mixed", num_workers=2), "bf16-mixed")


def test_the_strategy_needs_a_launcher(monkeypatch) -> None:
    monkeypatch.delenv(RENDEZVOUS_ENV, raising=False)
    with pytest.raises(pt.LauncherRequiredError, match="psrv.run"):
        pt.PsrvStrategy()
