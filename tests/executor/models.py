"""Tiny chains for executor tests, and a measured profile of them.

`measured_profile` measures a chain by docs/chain-model.md's rules (saved-tensor hooks,
exact CPU allocation accounting); it stands in until profiler.profile_chain lands, and is replaced
by it when that exists.
"""

from __future__ import annotations

import time

import torch
from memplan.profiler.schema import Profile
from torch import nn


class Block(nn.Module):
    """Linear -> (BatchNorm1d) -> GELU -> Dropout, with a residual connection."""

    def __init__(self, width: int, *, dropout: float = 0.1, batchnorm: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.bn = nn.BatchNorm1d(width) if batchnorm else nn.Identity()
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, W) -> (B, W)
        return x + self.drop(self.act(self.bn(self.fc(x))))


class Head(nn.Module):
    """Linear to classes, then cross-entropy against fixed targets (the loss lives in the stage)."""

    def __init__(self, width: int, classes: int, targets: torch.Tensor) -> None:
        super().__init__()
        self.fc = nn.Linear(width, classes)
        self.register_buffer("targets", targets, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, W) -> ()
        return nn.functional.cross_entropy(self.fc(x), self.targets)


class TokenEmbed(nn.Module):
    """Integer tokens -> vectors (a stage whose input needs no gradient)."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B,) int64 -> (B, W)
        return self.emb(idx)


def mlp_chain(n_blocks: int = 6, *, width: int = 64, batch: int = 32, dropout: float = 0.1,
              batchnorm: bool = True, tokens: bool = False, seed: int = 0):
    """(stages, example_input): [embed?] + blocks + head; BatchNorm in every other block."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    stages: list[nn.Module] = []
    if tokens:
        stages.append(TokenEmbed(50, width))
        x = torch.randint(0, 50, (batch,), generator=g)
    else:
        x = torch.randn(batch, width, generator=g)
    for i in range(n_blocks):
        stages.append(Block(width, dropout=dropout, batchnorm=batchnorm and i % 2 == 0))
    targets = torch.randint(0, 10, (batch,), generator=g)
    stages.append(Head(width, 10, targets))
    for s in stages:
        s.train()
    return stages, x


def _bytes(value) -> int:
    from memplan.profiler.tensors import storage_bytes

    return storage_bytes([value])


def measured_profile(stages, x, *, name: str = "mlp", repeats: int = 3) -> Profile:
    """A chain-model profile of `stages` on the CPU: exact bytes, median times."""
    try:
        from memplan.profiler import profile_chain  # the real one, once it exists
    except ImportError:
        profile_chain = None
    if profile_chain is not None:
        return profile_chain(stages, x, repeats=repeats, warmup=1)
    return _fallback_profile(stages, x, name=name, repeats=repeats)


def _fallback_profile(stages, x, *, name, repeats):
    from memplan.profiler.memory import measure_memory

    rng = torch.get_rng_state()
    state = [{k: v.clone() for k, v in s.state_dict().items()} for s in stages]
    for s in stages:
        for p in s.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    layers = []
    a = x
    for i, stage in enumerate(stages, start=1):
        inp = a.detach()
        if inp.is_floating_point():
            inp.requires_grad_(True)
        excluded = {p.untyped_storage().data_ptr() for p in stage.parameters()}
        excluded.add(inp.untyped_storage().data_ptr())
        saved: dict[int, int] = {}

        def pack(t, saved=saved):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        fs, bs = [], []
        for _ in range(repeats):
            saved.clear()
            with measure_memory() as mf, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                t0 = time.perf_counter()
                out = stage(inp)
                fs.append(time.perf_counter() - t0)
            x_out = _bytes(out)
            s_bytes = sum(v for k, v in saved.items()
                          if k not in excluded and k != out.untyped_storage().data_ptr())
            saved.clear()
            tf = mf.peak_bytes - mf.end_bytes
            del out
            out = stage(inp)  # the backward is measured on a forward without saved-tensor hooks
            g = torch.ones_like(out) if i == len(stages) else torch.randn_like(out)
            with measure_memory() as mb:
                t0 = time.perf_counter()
                out.backward(g)
                bs.append(time.perf_counter() - t0)
            dx = _bytes(inp.grad) if inp.grad is not None else 0
            tb = max(0, mb.peak_bytes - dx)
            if inp.grad is not None:
                inp.grad = None
            del g, out
        layers.append(dict(
            name=f"{i}.{type(stage).__name__.lower()}", kind=type(stage).__name__.lower(),
            forward_s=sorted(fs)[len(fs) // 2], backward_s=sorted(bs)[len(bs) // 2],
            output_bytes=x_out, saved_bytes=s_bytes, forward_temp_bytes=max(0, tf),
            backward_temp_bytes=tb, param_bytes=sum(p.numel() * p.element_size() for p in stage.parameters()),
        ))
        with torch.no_grad():
            a = stage(a)
    for s, st in zip(stages, state, strict=True):
        s.load_state_dict(st)
        for p in s.parameters():
            p.grad.zero_()
    torch.set_rng_state(rng)
    return Profile(name=name, input_bytes=_bytes(x), layers=layers)


def every_strategy(prof: Profile, fraction: float):
    """(strategy, plan) for every planner strategy at `fraction` of the store-all peak; with no
    budget where a strategy cannot meet it (sqrt and uniform ignore budgets)."""
    from memplan import planner
    store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    for strategy in sorted(planner.STRATEGIES):
        plan = planner.plan(prof, strategy=strategy, budget_bytes=int(store * fraction))
        if not plan.schedule:
            plan = planner.plan(prof, strategy=strategy)
        yield strategy, plan
