"""Hugging Face `Trainer` trains a model with memplan's plan installed (issue 21): the same losses
and the same final parameters as an unplanned Trainer run over the same steps."""

from __future__ import annotations

import pytest

from tests.hf_tiny import VOCAB, tiny_lm

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="Hugging Face Trainer needs accelerate: pip install 'accelerate>=1.0'")

from memplan.executor.apply import profile_model  # noqa: E402

import memplan  # noqa: E402

BATCH, SEQ, STEPS = 4, 16, 3


class _Rows(torch.utils.data.Dataset):
    """Fixed random token rows, labels equal to the inputs (the model shifts them)."""

    def __init__(self, n: int, seed: int = 3) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


class _Recording(transformers.Trainer):
    """A Trainer that keeps every training step's exact loss (the logged ones are rounded)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.losses: list[float] = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        value = loss[0] if isinstance(loss, tuple) else loss
        self.losses.append(float(value.detach()))
        return loss


def _train(model, tmp_path, name: str) -> _Recording:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / name), max_steps=STEPS, per_device_train_batch_size=BATCH,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = _Recording(model=model, args=args, train_dataset=_Rows(4 * BATCH))
    trainer.train()
    return trainer


def test_trainer_runs_the_installed_plan_with_the_unplanned_losses(tmp_path):
    plain = tiny_lm("gpt2", "eager", n_layer=4, width=32, dropout=0.1, seed=0)
    planned = tiny_lm("gpt2", "eager", n_layer=4, width=32, dropout=0.1, seed=0)
    example = _Rows(BATCH)[0]
    batch = {k: torch.stack([_Rows(BATCH)[i][k] for i in range(BATCH)]) for k in example}
    prof = profile_model(planned, batch)
    store_all = memplan.plan(prof, strategy="store-all").predicted.peak_bytes
    plan = memplan.auto_checkpoint(planned, batch, budget=store_all // 2, profile=prof)
    # the plan recomputes: a plan that stored everything would make this test vacuous
    assert plan.predicted.peak_bytes <= store_all // 2 < store_all
    assert plan.predicted.overhead > 0 and any(op[0] == "F" for op in plan.schedule)

    calls = {"plain": 0, "planned": 0}

    def counter(key):
        def hook(module, args, out):
            calls[key] += 1
        return hook

    for key, model in (("plain", plain), ("planned", planned)):
        for block in model.transformer.h:
            block.register_forward_hook(counter(key))
    ref = _train(plain, tmp_path, "plain")
    got = _train(planned, tmp_path, "planned")

    assert len(ref.losses) == STEPS and got.losses == ref.losses
    for (name, p), q in zip(plain.named_parameters(), planned.parameters(), strict=True):
        assert torch.equal(p, q), name
    # the plan ran inside Trainer's steps: its blocks were called again for the recomputes
    assert calls["plain"] == STEPS * 4
    assert calls["planned"] > calls["plain"]
