"""Training one Mamba-3 MIMO layer under a rounding policy, with the FP64 gradient of the same weights at every step.

The layer (:class:`LayerConfig`, parameters from :func:`init_params`): ``x [B, S, d_model]`` -> an input projection
-> ``Q, K [B, S, R, G, N]``, ``V, Z [B, S, H, P]``, a DT pre-activation, Trap and the raw Angles; ``DT =
softplus(dt_pre + dt_bias)``, ``ADT = -exp(A_log)·DT``; learned ``Q_bias``, ``K_bias``, ``MIMO_V``, ``MIMO_Z``,
``MIMO_Out``, ``D``; ``mamba3_mimo`` (:mod:`.autograd`) under the policy; an output projection ``[B, S, H·P] ->
[B, S, d_out]``. The projections run in float32; Q, K, V, Z and Trap are cast to the policy's lp dtype before the op,
as a bf16 model would (autograd's cast backward passes the gradient through, and stores the gradient of a bf16
tensor in bf16, upstream's dtype for dQ, dK, dV, dZ, dTrap).

The task (:class:`TaskConfig`, :func:`make_batch`): imitate a linear recurrence, ``h_t = a ⊙ h_{t-1} + sqrt(1 - a²)
⊙ (U x_t)``, ``y_t = W h_t / sqrt(m)`` with per-channel decays ``a`` (two rates), unit-variance ``x``; the loss is the
mean squared error to ``y`` (about 1 for a zero output). A fresh batch per step from a generator seeded by ``(seed,
step)``, so every policy sees the same data.

The FP64 gradient (:func:`fp64_step`): the same layer in float64 around ``fp64_model.mamba3_mimo_fp64`` (an
independent FP64 implementation, differentiated by autograd), with the op's inputs held at exactly the values the
policy run fed the op (its float32 DT, ADT, Angles and its lp Q, K, V, Z, Trap, through straight-through casts), so
the two gradients differ by the op's numerics under the policy (and float32 arithmetic of the projections, ~1e-7).

:func:`train` runs the steps for one policy and one seed (Adam on float32 weights, the policy's gradient applied) and
records, per step, the policy's loss, the FP64 loss at the same weights and the rel RMS of every parameter's gradient
against the FP64 gradient; :func:`train_demo` runs several policies and seeds from the same initial weights and
writes the JSON, the plots and a README whose reading :func:`reading` computes from the results
(``mimo-numerics train-demo``, ``docs/whole_op.md``).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from .. import presets as _presets
from ..metrics import rel_rms
from ..ops.mamba3_mimo.autograd import mamba3_mimo
from ..ops.mamba3_mimo.cases import OP_INPUT_NAMES
from ..ops.mamba3_mimo.fp64_model import mamba3_mimo_fp64
from ..ops.mamba3_mimo.runs import backend_for  # noqa: F401  (re-exported: the training study's backend rule)
from .. import provenance

#: The site the demo's fourth policy turns off: the switch ranked first by score in the one-site-off ranking of the
#: whole op over the 11 bfloat16 golden cases (``reports/mamba3_mimo_site_ranking.json``, ``rows[0]``; its score
#: and error drop are in ``reports/mamba3_mimo_site_ranking.md``). ``tests/studies/test_mamba3_mimo_training.py`` checks
#: that it is still that report's first switch.
DEFAULT_SITE_OFF = "mamba_mimo_bwd_bwd.z_zeta"
#: Where :data:`DEFAULT_SITE_OFF` comes from (relative to the repository root).
SITE_RANKING_REPORT = "reports/mamba3_mimo_site_ranking.json"
#: Steps of the window "over the last steps" (and "over the first steps") of the reading.
WINDOW = 20
#: Parameters of the layer, in a fixed order.
PARAM_NAMES = ("in_proj", "dt_bias", "A_log", "Q_bias", "K_bias", "MIMO_V", "MIMO_Z", "MIMO_Out", "D", "out_proj")


@dataclass(frozen=True)
class LayerConfig:
    """Sizes of the layer. ``chunk_size`` must be a power of 2 dividing the task's ``seqlen`` (the float32 chain)."""

    d_model: int = 16
    d_out: int = 8
    heads: int = 2
    groups: int = 1
    state_dim: int = 16
    value_dim: int = 16
    rank: int = 2
    chunk_size: int = 8
    rotary_dim_divisor: int = 4

    @property
    def angle_dim(self) -> int:
        return self.state_dim // self.rotary_dim_divisor

    def split_sizes(self) -> Tuple[int, ...]:
        """Widths of the input projection's outputs: Q, K, V, Z, dt, trap, angles."""
        qk = self.rank * self.groups * self.state_dim
        hp = self.heads * self.value_dim
        return (qk, qk, hp, hp, self.heads, self.heads, self.heads * self.angle_dim)


@dataclass(frozen=True)
class TaskConfig:
    """The linear-recurrence task: batch, sequence length, teacher channels and their two decay rates."""

    batch: int = 4
    seqlen: int = 32
    channels: int = 8
    decays: Tuple[float, float] = (0.7, 0.95)


#: The smallest layer and task the tests and their measurement (scripts/measure_test_tolerances.py) train.
TINY_LAYER = LayerConfig(d_model=8, d_out=4, heads=2, state_dim=16, value_dim=8, rank=2, chunk_size=8)
TINY_TASK = TaskConfig(batch=2, seqlen=16, channels=4)
#: The policies of the smoke run (``--smoke`` of :func:`main`, tests/studies/test_mamba3_mimo_training.py).
SMOKE_POLICIES = ("fp64", "upstream_sm90", "upstream_sm90 - mamba_mimo_bwd_bwd.dphio_gate")


@dataclass(frozen=True)
class DemoConfig:
    """One demo: sizes, steps, learning rate, seeds, the policies to train and the device."""

    layer: LayerConfig = field(default_factory=LayerConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    steps: int = 200
    lr: float = 2e-2
    seeds: Tuple[int, ...] = (0, 1, 2)
    policies: Tuple[str, ...] = ("fp64", "fp32", "upstream_sm90", f"upstream_sm90 - {DEFAULT_SITE_OFF}")
    eval_every: int = 10
    device: str = "cpu"
    backend: str = "reference"


def policy_from_label(label: str):
    """A preset name, or ``"<preset> - <operator>.<site>"``: that preset with one site not rounded."""
    if " - " in label:
        base, site = (part.strip() for part in label.split(" - ", 1))
        return _presets.get(base).replace(**{site: False})
    return _presets.get(label)


# ---------------------------------------------------------------------------------------------------- the task
def teacher(cfg: LayerConfig, task: TaskConfig, seed: int) -> Dict[str, torch.Tensor]:
    """The teacher recurrence's fixed weights (float64, CPU): ``U [m, d_model]``, ``W [d_out, m]``, ``a [m]``."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    m = task.channels
    a = torch.tensor([task.decays[i % 2] for i in range(m)], dtype=torch.float64)
    return {"U": torch.randn(m, cfg.d_model, generator=gen, dtype=torch.float64) / math.sqrt(cfg.d_model),
            "W": torch.randn(cfg.d_out, m, generator=gen, dtype=torch.float64), "a": a}


def make_batch(cfg: LayerConfig, task: TaskConfig, teacher_weights: Dict[str, torch.Tensor], seed: int,
               step: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``x [B, S, d_model]`` and the target ``y [B, S, d_out]`` (float32, CPU) of one step."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(task.batch, task.seqlen, cfg.d_model, generator=gen, dtype=torch.float64)
    u = x @ teacher_weights["U"].T  # [B, S, m]
    a = teacher_weights["a"]
    h = torch.zeros(task.batch, task.channels, dtype=torch.float64)
    ys = []
    for t in range(task.seqlen):
        h = a * h + torch.sqrt(1 - a * a) * u[:, t]
        ys.append(h @ teacher_weights["W"].T / math.sqrt(task.channels))
    return x.float(), torch.stack(ys, dim=1).float()


# ---------------------------------------------------------------------------------------------------- the layer
def init_params(cfg: LayerConfig, seed: int) -> Dict[str, torch.Tensor]:
    """Initial float32 weights (CPU), the same for every policy of a seed."""
    gen = torch.Generator().manual_seed(seed)
    H, R, N, P = cfg.heads, cfg.rank, cfg.state_dim, cfg.value_dim

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    dt = torch.exp(torch.rand(H, generator=gen) * (math.log(0.1) - math.log(0.01)) + math.log(0.01))
    return {
        "in_proj": randn(sum(cfg.split_sizes()), cfg.d_model, scale=1 / math.sqrt(cfg.d_model)),
        "dt_bias": dt + torch.log(-torch.expm1(-dt)),  # softplus(dt_bias) = dt in [0.01, 0.1]
        "A_log": torch.log(torch.arange(1, H + 1, dtype=torch.float32)),
        "Q_bias": 1 / math.sqrt(N) + randn(H, R, N, scale=0.1 / math.sqrt(N)),
        "K_bias": 1 / math.sqrt(N) + randn(H, R, N, scale=0.1 / math.sqrt(N)),
        "MIMO_V": 1 + randn(H, R, P, scale=0.1),
        "MIMO_Z": 1 + randn(H, R, P, scale=0.1),
        "MIMO_Out": (1 + randn(H, R, P, scale=0.1)) / R,
        "D": torch.zeros(H),
        "out_proj": randn(cfg.d_out, H * P, scale=1 / math.sqrt(H * P)),
    }


def _activations(params: Dict[str, torch.Tensor], x: torch.Tensor, cfg: LayerConfig) -> Dict[str, torch.Tensor]:
    """The op's inputs computed by the projections, in the dtype of ``params`` (no lp cast)."""
    B, S, _ = x.shape
    H, G, R, N, P = cfg.heads, cfg.groups, cfg.rank, cfg.state_dim, cfg.value_dim
    q, k, v, z, dt_pre, trap, angles = torch.split(x @ params["in_proj"].T, cfg.split_sizes(), dim=-1)
    dt = torch.nn.functional.softplus(dt_pre + params["dt_bias"]).permute(0, 2, 1)  # [B, H, S]
    return {"Q": q.reshape(B, S, R, G, N), "K": k.reshape(B, S, R, G, N), "V": v.reshape(B, S, H, P),
            "Z": z.reshape(B, S, H, P), "DT": dt, "ADT": -torch.exp(params["A_log"])[None, :, None] * dt,
            "Trap": trap.permute(0, 2, 1), "Angles": angles.reshape(B, S, H, cfg.angle_dim)}


_LP = ("Q", "K", "V", "Z", "Trap")


def _op_inputs(params, acts, lp_values=None, lp_dtype=None):
    """The 14 inputs of the op. ``lp_dtype``: cast Q, K, V, Z, Trap (the policy run). ``lp_values``: the policy
    run's values of every activation, held by straight-through casts (the FP64 run)."""
    x = {}
    for name, value in acts.items():
        if lp_values is not None:
            value = value + (lp_values[name].to(value.dtype) - value).detach()
        elif name in _LP:
            value = value.to(lp_dtype)
        x[name] = value
    for name in ("Q_bias", "K_bias", "MIMO_V", "MIMO_Z", "MIMO_Out", "D"):
        x[name] = params[name]
    return [x[name] for name in OP_INPUT_NAMES]


def _loss(out: torch.Tensor, params, target: torch.Tensor) -> torch.Tensor:
    B, S = out.shape[:2]
    y = out.reshape(B, S, -1) @ params["out_proj"].T
    return torch.mean((y - target.to(y.dtype)) ** 2)


def policy_step(params: Dict[str, torch.Tensor], x: torch.Tensor, target: torch.Tensor, cfg: LayerConfig, policy,
                backend: str = "reference") -> Tuple[float, Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """Loss and float32 gradients of every parameter with the op under ``policy``; also the op's input values
    (for :func:`fp64_step`)."""
    policy = _presets.resolve(policy)
    leaves = {name: p.detach().clone().requires_grad_(True) for name, p in params.items()}
    acts = _activations(leaves, x, cfg)
    inputs = _op_inputs(leaves, acts, lp_dtype=policy.lp_torch_dtype)
    out = mamba3_mimo(*inputs, cfg.chunk_size, cfg.rotary_dim_divisor, policy=policy, backend=backend)
    loss = _loss(out.float(), leaves, target)
    loss.backward()
    values = {name: inputs[OP_INPUT_NAMES.index(name)].detach() for name in acts}
    return float(loss.detach()), {name: leaf.grad for name, leaf in leaves.items()}, values


def fp64_step(params: Dict[str, torch.Tensor], x: torch.Tensor, target: torch.Tensor, cfg: LayerConfig,
              op_values: Optional[Dict[str, torch.Tensor]] = None) -> Tuple[float, Dict[str, torch.Tensor]]:
    """Loss and float64 gradients of the same layer in float64 around the FP64 model; with ``op_values`` the op
    sees exactly those input values (straight-through), else the float64 activations themselves."""
    leaves = {name: p.detach().to(torch.float64).requires_grad_(True) for name, p in params.items()}
    acts = _activations(leaves, x.to(torch.float64), cfg)
    inputs = _op_inputs(leaves, acts, lp_values=op_values) if op_values is not None else _op_inputs(
        leaves, acts, lp_values=acts)
    out = mamba3_mimo_fp64(*inputs, cfg.chunk_size, cfg.rotary_dim_divisor)
    loss = _loss(out, leaves, target)
    loss.backward()
    return float(loss.detach()), {name: leaf.grad for name, leaf in leaves.items()}


# ---------------------------------------------------------------------------------------------------- training
def train(cfg: LayerConfig, task: TaskConfig, policy_label: str, seed: int, steps: int, *, lr: float = 1e-2,
          eval_every: int = 10, device: Union[str, torch.device] = "cpu", backend: str = "reference",
          progress: Optional[Callable[[int], None]] = None) -> dict:
    """Train the layer from ``init_params(cfg, seed)`` for ``steps`` Adam steps with the gradients of the op under
    ``policy_label`` (:func:`policy_from_label`).

    Returns:
        dict: ``loss`` (per step, the policy's loss), ``loss_fp64`` (the FP64 loss at the same weights),
        ``grad_rel_rms`` (per parameter, per step: rel RMS of the policy's gradient against the FP64 gradient),
        ``grad_rel_rms_all`` (per step, over all parameters at once), ``eval_steps`` and ``eval_loss`` (the FP64
        loss of the weights on a fixed held-out batch), ``seconds``.
    """
    policy = policy_from_label(policy_label)
    device = torch.device(device)
    params = {name: p.to(device) for name, p in init_params(cfg, seed).items()}
    teacher_weights = teacher(cfg, task, seed)
    eval_x, eval_y = (t.to(device) for t in make_batch(cfg, task, teacher_weights, seed, step=-1))
    opt_params = {name: p.clone().requires_grad_(True) for name, p in params.items()}
    optimizer = torch.optim.Adam(list(opt_params.values()), lr=lr)
    record = {"loss": [], "loss_fp64": [], "grad_rel_rms": {n: [] for n in PARAM_NAMES}, "grad_rel_rms_all": [],
              "eval_steps": [], "eval_loss": []}
    start = time.perf_counter()
    for step in range(steps):
        current = {name: p.detach() for name, p in opt_params.items()}
        if step % eval_every == 0:
            record["eval_steps"].append(step)
            record["eval_loss"].append(fp64_step(current, eval_x, eval_y, cfg)[0])
        x, y = (t.to(device) for t in make_batch(cfg, task, teacher_weights, seed, step))
        loss, grads, values = policy_step(current, x, y, cfg, policy, backend=backend)
        loss64, grads64 = fp64_step(current, x, y, cfg, op_values=values)
        record["loss"].append(loss)
        record["loss_fp64"].append(loss64)
        for name in PARAM_NAMES:
            record["grad_rel_rms"][name].append(rel_rms(grads[name], grads64[name]))
        record["grad_rel_rms_all"].append(rel_rms(torch.cat([grads[n].flatten() for n in PARAM_NAMES]),
                                                  torch.cat([grads64[n].flatten() for n in PARAM_NAMES])))
        optimizer.zero_grad(set_to_none=True)
        for name, p in opt_params.items():
            p.grad = grads[name].to(p.dtype)
        optimizer.step()
        if progress is not None:
            progress(step)
    final = {name: p.detach() for name, p in opt_params.items()}
    record["eval_steps"].append(steps)
    record["eval_loss"].append(fp64_step(final, eval_x, eval_y, cfg)[0])
    record["seconds"] = time.perf_counter() - start
    return record


def run_demo(config: DemoConfig, progress: Optional[Callable[[str], None]] = None) -> dict:
    """Every (policy, seed) of ``config``: ``{"config": ..., "runs": {policy: {seed: train(...)}}}``."""
    runs: Dict[str, Dict[str, dict]] = {}
    for label in config.policies:
        policy_from_label(label)  # fail early on a bad label
    for seed in config.seeds:
        for label in config.policies:
            runs.setdefault(label, {})[str(seed)] = train(
                config.layer, config.task, label, seed, config.steps, lr=config.lr,
                eval_every=config.eval_every, device=config.device,
                backend=backend_for(policy_from_label(label), config.backend))
            if progress is not None:
                progress(f"{label} seed {seed}: {runs[label][str(seed)]['seconds']:.1f} s")
    return {"config": asdict(config), "runs": runs}


# ---------------------------------------------------------------------------------------------------- plots
def _band(ax, steps, series: Sequence[Sequence[float]], label: str, color, log: bool = True):
    import numpy as np

    data = np.asarray(series, dtype=float)
    centre = np.exp(np.log(data).mean(0)) if log else data.mean(0)
    ax.plot(steps, centre, color=color, label=label, linewidth=1.4)
    ax.fill_between(steps, data.min(0), data.max(0), color=color, alpha=0.2, linewidth=0)


def plot_results(results: dict, out_dir: Path) -> List[Path]:
    """Write ``loss.png``, ``grad_error.png`` and ``grad_error_per_param.png`` to ``out_dir``: geometric mean over
    the seeds as a line, min/max over the seeds as a band."""
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    runs = results["runs"]
    colors = ["black", "tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange"]
    written = []

    fig = Figure(figsize=(15, 4.2), layout="constrained")
    ax_train, ax_eval, ax_part = fig.subplots(1, 3)
    for i, (label, by_seed) in enumerate(runs.items()):
        seeds = list(by_seed.values())
        _band(ax_train, range(len(seeds[0]["loss"])), [r["loss"] for r in seeds], label, colors[i % len(colors)])
        _band(ax_eval, seeds[0]["eval_steps"], [r["eval_loss"] for r in seeds], label, colors[i % len(colors)])
    parting = trajectory_parting(results)
    for i, label in enumerate(runs):
        if label in parting:
            # from step 1: at step 0 every run has the same weights (difference 0)
            _band(ax_part, range(1, len(parting[label][0])), [run[1:] for run in parting[label]], label,
                  colors[i % len(colors)])
    ax_train.set(yscale="log", xlabel="step", ylabel="MSE (training batch, op under the policy)",
                 title="training loss")
    ax_eval.set(yscale="log", xlabel="step", ylabel="MSE (held-out batch, FP64 model)",
                title="held-out loss of the weights")
    ax_part.set(yscale="log", xlabel="step", ylabel="|L(w_policy) / L(w_fp64) - 1|, same seed and batch",
                title="how far the weights part from the fp64 run's")
    ax_eval.legend(fontsize=8)
    path = out_dir / "loss.png"
    fig.savefig(path, dpi=110)
    written.append(path)

    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    for i, (label, by_seed) in enumerate(runs.items()):
        seeds = list(by_seed.values())
        _band(ax, range(len(seeds[0]["grad_rel_rms_all"])), [r["grad_rel_rms_all"] for r in seeds], label,
              colors[i % len(colors)])
    ax.set(yscale="log", xlabel="step", ylabel="rel RMS of the gradient vs FP64 (all parameters)",
           title="gradient error along training")
    ax.legend(fontsize=8)
    path = out_dir / "grad_error.png"
    fig.savefig(path, dpi=110)
    written.append(path)

    fig = Figure(figsize=(13, 7.5), layout="constrained")
    axes = fig.subplots(2, 5, sharex=True).flatten()
    for j, name in enumerate(PARAM_NAMES):
        for i, (label, by_seed) in enumerate(runs.items()):
            seeds = list(by_seed.values())
            _band(axes[j], range(len(seeds[0]["loss"])), [r["grad_rel_rms"][name] for r in seeds], label,
                  colors[i % len(colors)])
        axes[j].set(yscale="log", title=name, xlabel="step" if j >= 5 else None)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8)
    fig.suptitle("rel RMS of each parameter's gradient vs FP64 (line: geometric mean over seeds; band: min-max)")
    path = out_dir / "grad_error_per_param.png"
    fig.savefig(path, dpi=100)
    written.append(path)
    return written


def trajectory_parting(results: dict, reference: str = "fp64") -> Dict[str, List[List[float]]]:
    """Per policy other than ``reference``, per seed, per step: ``|L(w_policy) / L(w_reference) - 1|`` of the FP64
    losses of the two runs' weights on the same batch (``loss_fp64``): how far the trajectories have parted.
    Empty without a ``reference`` run."""
    runs = results["runs"]
    if reference not in runs:
        return {}
    out = {}
    for label, by_seed in runs.items():
        if label == reference:
            continue
        out[label] = [[max(abs(a / b - 1.0), 1e-12) for a, b in zip(by_seed[seed]["loss_fp64"],
                                                                   runs[reference][seed]["loss_fp64"])]
                      for seed in by_seed]
    return out


def summarize(results: dict) -> Dict[str, dict]:
    """Per policy, over the seeds: median gradient error over the steps (all parameters; and per parameter), the
    final training and held-out losses (min, max)."""
    from statistics import median

    out = {}
    for label, by_seed in results["runs"].items():
        seeds = list(by_seed.values())
        out[label] = {
            "grad_rel_rms_all_median": [median(r["grad_rel_rms_all"]) for r in seeds],
            "grad_rel_rms_median": {n: [median(r["grad_rel_rms"][n]) for r in seeds] for n in PARAM_NAMES},
            "final_eval_loss": [r["eval_loss"][-1] for r in seeds],
            "first_eval_loss": [r["eval_loss"][0] for r in seeds],
            "final_train_loss_mean10": [sum(r["loss"][-10:]) / len(r["loss"][-10:]) for r in seeds],
            "seconds": [r["seconds"] for r in seeds],
        }
    return out


def write_results(results: dict, out_dir: Path) -> Path:
    """The numbers as ``results.json`` (config, per-step records, summary)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    payload = _rounded({**results, "summary": summarize(results)})
    path.write_text(json.dumps(payload, separators=(",", ":")) + "\n", encoding="utf-8")
    return path


def _rounded(value, digits: int = 6):
    """Floats to ``digits`` significant digits, recursively (the JSON is for reading and plotting)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v, digits) for v in value]
    return value


def train_demo(out_dir: Union[str, Path] = "reports/training_under_policy", *, steps: int = 200,
               seeds: Sequence[int] = (0, 1, 2), policies: Optional[Sequence[str]] = None, device: str = "cpu",
               realistic: bool = False, lr: float = 2e-2, threads: Optional[int] = 1, plots: bool = True,
               progress: Optional[Callable[[str], None]] = None,
               command: str = "mimo-numerics train-demo", smoke: bool = False, backend: str = "reference") -> dict:
    """The training experiment from one call (the CLI's ``train-demo``).

    Args:
        out_dir: where ``results.json``, the PNGs and ``README.md`` go.
        steps, seeds: Adam steps per run; one run per (policy, seed), the same initial weights and data for every
            policy of a seed.
        policies: labels for :func:`policy_from_label` (default: :class:`DemoConfig`'s four).
        device: ``"cpu"`` (small shapes, a few minutes on 2 cores) or ``"cuda"``.
        realistic: the larger shapes of :func:`realistic_config` (meant for ``device="cuda"``).
        lr: Adam's learning rate.
        threads: torch CPU threads while it runs (restored after); the small CPU shapes are bound by per-op
            overhead, and one thread was ~20x faster than two on a loaded 2-core machine. None: leave as is.
            Results depend on it only through FP32 summation order.
        plots: write the PNGs and the README.
        command: how the run was started, for the README.
        smoke: the run is the generator's smoke check (recorded; the README says its figures are not the report's).
        backend: ``mamba3_mimo``'s backend for the policies the Triton kernels can express (:func:`backend_for`;
            ``"triton"``: the package's kernels, compiled on CUDA, in the interpreter on CPU); the others, and the FP64
            gradient of every step, run the reference.

    Returns:
        dict: ``config``, ``runs``, ``summary`` and ``files`` (the paths written).
    """
    layer, task = (realistic_config() if realistic else (LayerConfig(), TaskConfig()))
    config = DemoConfig(layer=layer, task=task, steps=steps, lr=lr, seeds=tuple(seeds),
                        policies=tuple(policies) if policies else DemoConfig().policies, device=device,
                        backend=backend)
    saved_threads, saved_tf32 = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
    if threads is not None and torch.device(device).type == "cpu":
        torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # the projections in IEEE fp32 on CUDA too: no global flag decides
    recorded = provenance.collect(command=command)  # the commit and tree the run starts from
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        results = run_demo(config, progress=progress)
    finally:
        torch.set_num_threads(saved_threads)
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    results["wall_seconds"] = time.perf_counter() - start
    results["cpu_seconds"] = time.process_time() - cpu_start
    results["threads"] = threads
    results["command"] = command
    results["smoke"] = smoke
    results["provenance"] = recorded
    try:
        results["load_average"] = list(os.getloadavg())  # the machine may be shared: say how busy it was
    except OSError:
        results["load_average"] = None
    out_dir = Path(out_dir)
    files = [write_results(results, out_dir)]
    if plots:
        files += plot_results(results, out_dir)
        files.append(write_readme(results, out_dir, command=command))
    return {**results, "summary": summarize(results), "files": [str(f) for f in files]}


def realistic_config() -> Tuple[LayerConfig, TaskConfig]:
    """A layer at a realistic size, for ``device="cuda"``: N = P = 64, R = 4, C = 16 as upstream's tests, H = 16
    heads, S = 2048 tokens (issue 22: S >= 2048, H >= 16), batch 2. The per-step FP64 gradient runs the chunked FP64
    model and the ``fp64`` policy the FP64 oracles, both in memory linear in S."""
    return (LayerConfig(d_model=256, d_out=64, heads=16, groups=1, state_dim=64, value_dim=64, rank=4, chunk_size=16),
            TaskConfig(batch=2, seqlen=2048, channels=32))


# ---------------------------------------------------------------------------------------------------- README, CLI
def _span(values: Sequence[float]) -> str:
    return f"{min(values):.2e} – {max(values):.2e}"


def _geo(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-300)) for v in values) / len(values))


def _median(values: Sequence[float]) -> float:
    from statistics import median

    return median(values)


def _seeds(results: dict) -> List[str]:
    return [str(s) for s in results["config"]["seeds"]]


def paired(results: dict, label: str, against: str) -> Dict[str, List[float]]:
    """Run ``label`` against run ``against`` seed by seed (the same initial weights and data): per seed, the ratio of
    their median gradient errors (``ratio``) and the fraction of the steps at which ``label``'s gradient error is
    the lower (``lower``)."""
    runs = results["runs"]
    ratio, lower = [], []
    for seed in _seeds(results):
        a, b = runs[label][seed]["grad_rel_rms_all"], runs[against][seed]["grad_rel_rms_all"]
        ratio.append(_median(a) / _median(b))
        lower.append(sum(1 for x, y in zip(a, b) if x < y) / len(a))
    return {"ratio": ratio, "lower": lower}


def separated(pair: Dict[str, List[float]]) -> bool:
    """Whether a :func:`paired` comparison is on one side in every seed: every ratio below 1 with the run lower on
    at least two thirds of the steps, or every ratio above 1 with it lower on at most one third."""
    below = all(r < 1 for r in pair["ratio"]) and all(f >= 2 / 3 for f in pair["lower"])
    above = all(r > 1 for r in pair["ratio"]) and all(f <= 1 / 3 for f in pair["lower"])
    return below or above


def window_growth(results: dict, label: str, window: int = WINDOW) -> List[float]:
    """Per seed: the median gradient error over the last ``window`` steps over that of the first ``window``."""
    out = []
    for seed in _seeds(results):
        values = results["runs"][label][seed]["grad_rel_rms_all"]
        w = max(1, min(window, len(values) // 2))
        out.append(_median(values[-w:]) / _median(values[:w]))
    return out


def parting_window(results: dict, window: int = WINDOW) -> Dict[str, List[float]]:
    """Per policy other than ``fp64``, per seed: the median over the last ``window`` steps of
    :func:`trajectory_parting` (how far the run's weights have moved from the ``fp64`` run's, read through the FP64
    loss of both on the same batch)."""
    out = {}
    for label, per_seed in trajectory_parting(results).items():
        out[label] = [_median(run[-max(1, min(window, len(run) - 1)):]) for run in per_seed]
    return out


def _ratios(values: Sequence[float], digits: int = 3) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def _pcts(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.0%}" for v in values)


def reading(results: dict) -> List[str]:
    """The README's reading as Markdown bullets, every figure computed here from ``results`` (a rerun rewrites
    it): the order of the policies and whether seed-by-seed comparisons separate them, the gradient error over
    training, how far the runs part from the ``fp64`` run, the held-out losses paired by seed, and the limits."""
    results = _rounded(results)
    summary = summarize(results)
    config = results["config"]
    labels = list(results["runs"])
    seeds = _seeds(results)
    n_seeds = len(seeds)
    per_seed = "per seed " if n_seeds > 1 else ""
    grad = {label: summary[label]["grad_rel_rms_all_median"] for label in labels}
    order = sorted(labels, key=lambda label: _geo(grad[label]))
    steps = config["steps"]
    window = max(1, min(WINDOW, steps // 2))
    bullets = []

    first = "* Gradient error (median over the steps, geometric mean over the seeds), smallest first: " + " < ".join(
        f"`{label}` ({_geo(grad[label]):.2e})" for label in order) + "."
    pairs = []
    for lower, higher in zip(order, order[1:]):
        pair = paired(results, lower, higher)
        if n_seeds == 1:
            verdict = ("one seed, one pair of runs: on one side over the steps" if separated(pair) else
                       "one seed, one pair of runs: not separated over the steps")
        else:
            verdict = ("separated in every seed" if separated(pair) else
                       "not separated: the per-seed ratios, or the steps, go both ways")
        pairs.append(f"`{lower}` / `{higher}`: ratio of the medians {per_seed}{_ratios(pair['ratio'])}, "
                     f"`{lower}` lower on {_pcts(pair['lower'])} of the steps ({verdict})")
    bullets.append(first + " Each neighbouring pair compared run against run (same seed: the same initial weights "
                   "and data, so the comparison is paired): " + "; ".join(pairs) + ".")
    site_labels = [label for label in labels if " - " in label]
    if site_labels and "upstream_sm90" in labels:
        lab = site_labels[0]
        base, site = (part.strip() for part in lab.split(" - ", 1))
        pair = paired(results, lab, base)
        source = (f"the switch ranked first over the 11 golden cases in `{SITE_RANKING_REPORT[:-5]}.md`"
                  if site == DEFAULT_SITE_OFF else "a site chosen on the command line")
        bullets.append(
            f"* `{site}` off ({source}): against `{base}`, ratio of the median gradient errors {per_seed}"
            f"{_ratios(pair['ratio'])}, lower on {_pcts(pair['lower'])} of the steps: "
            + (("a difference in every seed." if n_seeds > 1 else "on one side over the steps of the one seed.")
               if separated(pair) else
               "no difference this experiment can resolve (the seeds disagree in sign, or the steps split near "
               "half and half)."))
    if "fp64" in labels:
        other = [n for n in PARAM_NAMES if n != "in_proj"]
        worst = max(_geo(summary["fp64"]["grad_rel_rms_median"][n]) for n in other)
        bullets.append(
            f"* `fp64` is not zero ({_geo(grad['fp64']):.1e}): the op's FP64 gradients of its bf16 inputs (Q, K, V, "
            "Z, Trap) are stored in bf16 by autograd (a gradient has its input's dtype, as upstream's do), which "
            f"reaches `in_proj` ({_geo(summary['fp64']['grad_rel_rms_median']['in_proj']):.1e}); its other "
            f"parameters match FP64 to at most {worst:.0e} (float32 projections). `fp32` adds FP32 arithmetic and "
            "the bf16 output stores of the three kernels; `upstream_sm90` every bf16 site of the chain.")
    growth = {label: window_growth(results, label, window) for label in labels if label != "fp64"}
    if growth and steps >= 2 * window:
        bullets.append(
            f"* The gradient error changes along training (second figure): median over the last {window} steps "
            f"over the median over the first {window}, {per_seed}" + "; ".join(
                f"`{label}` {' / '.join(f'{v:.3f}' for v in values)}" for label, values in growth.items())
            + (": above 1 in every run, the error rises over training." if all(v > 1 for vs in growth.values()
                                                                            for v in vs) else "."))
    parting = parting_window(results, window)
    if parting:
        text = "; ".join(f"`{label}` {_geo(values):.1e}" + (f" ({_span(values)})" if n_seeds > 1 else "")
                         for label, values in parting.items())
        ratio = ""
        if "upstream_sm90" in parting and "fp32" in parting:
            factor = _geo(parting["upstream_sm90"]) / _geo(parting["fp32"])
            ratio = f" `upstream_sm90`'s run parts from the `fp64` run {factor:.1f}x more than `fp32`'s."
        bullets.append(
            f"* The runs part from the `fp64` run of their seed (third panel of `loss.png`): the FP64 loss of a "
            f"run's weights differs from that of the `fp64` run's weights on the same batch by a relative median "
            f"over the last {window} steps of {text}.{ratio} The gradient error at a step is measured at that run's "
            "own weights: it is the op's error there, not the accumulated difference between runs.")
    final = {label: summary[label]["final_eval_loss"] for label in labels}
    if "fp64" in labels and len(labels) > 1:
        rel = {label: [final[label][i] / final["fp64"][i] for i in range(n_seeds)] for label in labels
               if label != "fp64"}
        spread = max(abs(v - 1) for vs in rel.values() for v in vs)
        bullets.append(
            "* Held-out loss at the end, each run over the `fp64` run of the same seed: " + "; ".join(
                f"`{label}` {_ratios(values)}" for label, values in rel.items())
            + f": within {spread:.1%} of `fp64`. "
            + ("Different seeds are different teachers and data, so the spread between seeds is no noise floor for "
               "a policy's effect; the paired ratios are the comparison. " if n_seeds > 1 else "")
            + f"At this size and length the gradient errors above move the final held-out loss by at most "
              f"{spread:.1%}.")
    layer, task = config["layer"], config["task"]
    bullets.append(
        f"* What the curves cannot show: anything beyond this small layer (N = {layer['state_dim']}, P = "
        f"{layer['value_dim']}, R = {layer['rank']}, S = {task['seqlen']}; upstream is tuned for N = 128, P = 64, "
        f"R = 4, S = 2048), this task, this optimizer (Adam normalises each parameter's step, which hides a uniform "
        f"relative error) and {steps} steps. The FP64 reference holds the op's inputs at the policy run's bf16 "
        "values: the rounding of the activations themselves (shared by every policy) is not part of the error. "
        + (f"{n_seeds} seeds give a range, not a distribution." if n_seeds > 1 else
           "One seed: no range over seeds; every comparison above is one pair of runs."))
    return bullets


def write_readme(results: dict, out_dir: Path, command: str = "mimo-numerics train-demo",
                 compare_with: Optional[Tuple[str, dict]] = None, source_note: str = "") -> Path:
    """``README.md`` of the experiment: a provenance line, setup, the numbers (from ``results``), the figures and
    :func:`reading`; with ``compare_with = (folder, other results)`` a section :func:`size_comparison` against that
    run; ``source_note`` (markdown) goes under the provenance line."""
    results = _rounded(results)  # the numbers of results.json, so the README is a function of that file
    summary = summarize(results)
    config = results["config"]
    labels = list(results["runs"])
    load_average = results.get("load_average")
    load = ("load average %.1f / %.1f / %.1f (1 / 5 / 15 min)" % tuple(load_average) if load_average
            else "load average unknown")
    grad = {label: summary[label]["grad_rel_rms_all_median"] for label in labels}
    final = {label: summary[label]["final_eval_loss"] for label in labels}
    first = {label: summary[label]["first_eval_loss"] for label in labels}
    seeds = _seeds(results)
    rows = []
    for label in labels:
        s = summary[label]
        rows.append(f"| `{label}` | {_geo(grad[label]):.2e} ({_span(grad[label])}) | {_span(first[label])} | "
                    f"{_span(final[label])} | {_span(s['final_train_loss_mean10'])} | {sum(s['seconds']):.0f} |")
    param_rows = [f"| `{label}` | " + " | ".join(f"{_geo(summary[label]['grad_rel_rms_median'][n]):.1e}"
                                                 for n in PARAM_NAMES) + " |" for label in labels]
    layer, task = config["layer"], config["task"]
    wall, cpu = results.get("wall_seconds", float("nan")), results.get("cpu_seconds", float("nan"))
    table_head = ("| policy | gradient error, median over steps | held-out loss at step 0 | held-out loss at the end "
                  "| training loss, last 10 steps | seconds (all seeds) |")
    bullets = "\n".join(reading(results))
    smoke = ("**Smoke run** (a few steps, one seed: a check of the generator; its figures are not the report's.)\n\n"
             if results.get("smoke") else "")
    text = f"""# Training one Mamba-3 MIMO layer under a rounding policy

{smoke}{provenance.markdown_header(results.get("provenance") or provenance.collect(command=command))} Code: `mimo_numerics/studies/training.py`; device `{config['device']}`,
backend `{config.get('backend', 'reference')}`, {results.get('threads')} torch thread(s); {wall:.0f} s wall, {cpu:.0f} s of CPU time for the
{len(labels) * len(seeds)} runs (machine {load} at the end; on a shared machine the wall time grows with the load).

## Setup

* Layer: input projection `d_model={layer['d_model']}` -> Q, K `[B, S, R={layer['rank']}, G={layer['groups']},
  N={layer['state_dim']}]`, V, Z `[B, S, H={layer['heads']}, P={layer['value_dim']}]`, DT = softplus(projection +
  learned bias), ADT = -exp(A_log)·DT, Trap and Angles from the projection, learned Q_bias, K_bias, MIMO_V, MIMO_Z,
  MIMO_Out, D; `mamba3_mimo` (chunk size {layer['chunk_size']}) under the policy; output projection to
  `d_out={layer['d_out']}`. Projections in float32; Q, K, V, Z, Trap cast to bf16 before the op.
* Task: imitate a linear recurrence `h_t = a h_(t-1) + sqrt(1 - a²) U x_t`, `y_t = W h_t / sqrt(m)` (m =
  {task['channels']} channels, decays {task['decays']}), batch {task['batch']}, S = {task['seqlen']}, a fresh batch
  per step (the same for every policy of a seed); mean squared error, about 1 for a zero output.
* {config['steps']} Adam steps, lr {config['lr']}, seed(s) {', '.join(seeds)} (the seed sets the initial weights,
  the teacher and the data; every policy of a seed starts from the same weights and sees the same batches).
* At every step the gradient the policy gives is compared with the FP64 gradient of **the same weights**: the same
  layer in float64 around `fp64_model.mamba3_mimo_fp64` (independent of the chain), the op fed exactly the values
  the policy run fed it. The policy's gradient is the one applied.
* Policies: {', '.join(f'`{label}`' for label in labels)}.

## Numbers

Gradient error = rel RMS of all parameters' gradients at once against FP64; per run its median over the steps, then
the geometric mean over the seeds (min – max over seeds in brackets). Held-out loss = the FP64 model's loss of the
weights on one fixed batch (step 0 and after the last step); training loss = the policy's loss, mean of the last 10
steps.

{table_head}
|---|---|---|---|---|---|
{chr(10).join(rows)}

Per parameter (median over steps, geometric mean over seeds):

| policy | {' | '.join(PARAM_NAMES)} |
|---|{'---|' * len(PARAM_NAMES)}
{chr(10).join(param_rows)}

![loss](loss.png)

![gradient error](grad_error.png)

![gradient error per parameter](grad_error_per_param.png)

Lines: geometric mean over the seeds; bands: min – max over the seeds. `results.json` holds every step.

## Reading

Computed from `results.json` by `training.reading` (a rerun rewrites it).

{bullets}
"""
    if source_note:
        head, rest = text.split("\n\n## Setup", 1)
        text = f"{head}\n\n{source_note}\n\n## Setup{rest}"
    if compare_with is not None:
        text += "\n" + "\n".join(size_comparison(compare_with[1], results, compare_with[0])) + "\n"
    path = out_dir / "README.md"
    path.write_text(text, encoding="utf-8")
    return path


def _shape_text(results: dict) -> str:
    layer, task = results["config"]["layer"], results["config"]["task"]
    return (f"B = {task['batch']}, S = {task['seqlen']}, H = {layer['heads']}, N = {layer['state_dim']}, "
            f"P = {layer['value_dim']}, R = {layer['rank']}, C = {layer['chunk_size']}, d_model = "
            f"{layer['d_model']}, {results['config']['steps']} steps")


def _config_differences(there: dict, here: dict) -> List[str]:
    """``"key: A there, B here"`` for every run setting outside the layer and the task that differs (a missing
    ``backend``, from runs older than the option, is ``"reference"``)."""
    keys = sorted((set(there) | set(here)) - {"layer", "task", "policies", "seeds"})
    defaults = {"backend": "reference"}
    out = []
    for key in keys:
        x, y = there.get(key, defaults.get(key)), here.get(key, defaults.get(key))
        if x != y:
            out.append(f"{key} `{x}` there, `{y}` here")
    return out


def size_comparison(short: dict, long: dict, short_folder: str) -> List[str]:
    """A markdown section comparing two runs of the experiment (``short``: the one in ``short_folder``, ``long``:
    this one): gradient error per policy and per parameter (median over steps, geometric mean over seeds) side by
    side with their ratio, the paired ratio ``upstream_sm90`` / ``fp32``, and what else differs between them.

    Raises:
        ValueError: the two runs share no policy label.
    """
    a, b = _rounded(short), _rounded(long)
    labels = [label for label in b["runs"] if label in a["runs"]]
    if not labels:
        raise ValueError(f"short and long share no policy: short has {list(a['runs'])}, long has {list(b['runs'])}")
    sa, sb = summarize(a), summarize(b)
    differences = _config_differences(a["config"], b["config"])
    same_shape = _shape_text(a) == _shape_text(b)
    if same_shape:
        head = f"## Against `{short_folder}`: the same setup, " + ("; ".join(differences) or "nothing differs")
        note = ("The two runs differ only in what the heading names (the layer, the task, the steps and the "
                "seeds are the same), so a change below is that difference's.")
    else:
        head = f"## What changes with length: against `{short_folder}`"
        note = ("The sequence is not the only difference: the layer is larger (more heads, N, P, R) and the run "
                "shorter, so a change below is the change of the whole setup, read with that in mind.")
    lines = [head, "",
             f"Computed by `training.size_comparison` from the two `results.json`. There: {_shape_text(a)} "
             f"({a['config']['device']}). Here: {_shape_text(b)} ({b['config']['device']}). {note}", "",
             "| policy | gradient error there | here | here / there |", "|---|---|---|---|"]
    for label in labels:
        x, y = _geo(sa[label]["grad_rel_rms_all_median"]), _geo(sb[label]["grad_rel_rms_all_median"])
        lines.append(f"| `{label}` | {x:.2e} | {y:.2e} | {y / x:.2f} |")
    lines += ["", "Per parameter, here / there (median over steps, geometric mean over seeds):", "",
              "| policy | " + " | ".join(PARAM_NAMES) + " |", "|---|" + "---|" * len(PARAM_NAMES)]
    for label in labels:
        cells = []
        for name in PARAM_NAMES:
            x = _geo(sa[label]["grad_rel_rms_median"][name])
            y = _geo(sb[label]["grad_rel_rms_median"][name])
            cells.append(f"{y / x:.2f}")
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    lines.append("")
    if "upstream_sm90" in labels and "fp32" in labels:
        def ratio(s):
            return _geo(s["upstream_sm90"]["grad_rel_rms_all_median"]) / _geo(s["fp32"]["grad_rel_rms_all_median"])
        lines.append(f"* `upstream_sm90` over `fp32` (the share of the error the bf16 sites add): {ratio(sa):.2f} "
                     f"there, {ratio(sb):.2f} here.")
    ratios = {label: _geo(sb[label]["grad_rel_rms_all_median"]) / _geo(sa[label]["grad_rel_rms_all_median"])
              for label in labels}
    if ratios and all(r < 1 for r in ratios.values()):
        lines.append(f"* Every policy's gradient error is lower here (ratios {min(ratios.values()):.2f} to "
                     f"{max(ratios.values()):.2f})" + ("." if same_shape else ": in this experiment the longer "
                     "sequence and larger layer do not grow the relative error of the layer's gradients."))
    elif ratios and all(r > 1 for r in ratios.values()):
        lines.append(f"* Every policy's gradient error is higher here (ratios {min(ratios.values()):.2f} to "
                     f"{max(ratios.values()):.2f}).")
    if "fp32" in labels:
        drops = {n: _geo(sb["fp32"]["grad_rel_rms_median"][n]) / _geo(sa["fp32"]["grad_rel_rms_median"][n])
                 for n in PARAM_NAMES}
        low = sorted(drops, key=drops.get)[:3]
        lines.append("* Under `fp32` the parameters whose error falls most from there to here: "
                     + ", ".join(f"`{n}` ({drops[n]:.2f}x)" for n in low) + "; the largest ratio: "
                     + f"`{max(drops, key=drops.get)}` ({max(drops.values()):.2f}x).")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The CLI's ``train-demo``: parse ``argv`` and run :func:`train_demo`."""
    import argparse
    import datetime

    class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
        """Every default in ``--help``, except None and False (their help says what they mean)."""

        def _get_help_string(self, action):
            if action.default is None or action.default is False:
                return action.help
            return super()._get_help_string(action)

    parser = argparse.ArgumentParser(prog="mimo-numerics train-demo", description=(
        "Train one Mamba-3 MIMO layer under several rounding policies from the same initial weights, with the FP64 "
        "gradient of the same weights at every step; writes results.json, PNGs and README.md."),
        formatter_class=DefaultsShown)
    parser.add_argument("--out", default=None,
                        help="output folder (default: a new folder out/train-demo/<UTC yyyymmdd_HHMMSS> under the "
                             "current directory, so no earlier run or committed report is overwritten; the "
                             "committed report is --out reports/training_under_policy)")
    parser.add_argument("--steps", type=int, default=200, help="Adam steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per policy and seed")
    parser.add_argument("--policy", action="append", dest="policies", default=None,
                        help="a preset or '<preset> - <operator>.<site>' (repeat; default: "
                             f"{', '.join(DemoConfig().policies)})")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--backend", default="reference", choices=("reference", "triton"),
                        help="the op's backend for the policies the Triton kernels express (the others and the FP64 "
                             "gradient: the reference)")
    parser.add_argument("--realistic", action="store_true", help="shapes near upstream's (for --device cuda)")
    parser.add_argument("--lr", type=float, default=2e-2, help="Adam's learning rate")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads while training (0: leave as is)")
    parser.add_argument("--no-plots", action="store_true", help="write results.json only")
    parser.add_argument("--smoke", action="store_true",
                        help=f"a few seconds' check of the generator: 3 steps, seed 0, lr 1e-2, the policies "
                             f"{', '.join(SMOKE_POLICIES)}; the README says it is a smoke run")
    parser.add_argument("--compare-with", default=None,
                        help="a folder holding another run's results.json: the README gets a section comparing the "
                             "two (what changes with the size)")
    parser.add_argument("--source-note", default="",
                        help="a markdown paragraph put under the README's provenance line (e.g. which files a "
                             "device run had)")
    parser.add_argument("--from-results", action="store_true",
                        help="train nothing: rewrite the PNGs and README.md from --out's results.json")
    args = parser.parse_args(argv)
    if args.from_results and args.out is None:
        parser.error("--from-results needs --out, the folder holding results.json")
    if args.out is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d_%H%M%S")
        args.out = str(Path("out") / "train-demo" / stamp)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.from_results:
        out = Path(args.out)
        results = json.loads((out / "results.json").read_text(encoding="utf-8"))
        compare = None
        if args.compare_with:
            other = json.loads((Path(args.compare_with) / "results.json").read_text(encoding="utf-8"))
            compare = (args.compare_with, other)
        files = plot_results(results, out) + [write_readme(results, out, command=results.get(
            "command", "mimo-numerics train-demo"), compare_with=compare, source_note=args.source_note)]
        print("wrote " + ", ".join(str(f) for f in files))
        return 0
    command = "mimo-numerics train-demo" + ("" if not argv else " " + " ".join(argv))
    if args.smoke:
        args.steps, args.seeds, args.policies, args.lr = 3, [0], list(SMOKE_POLICIES), 1e-2
    result = train_demo(args.out, steps=args.steps, seeds=args.seeds, policies=args.policies, device=args.device,
                        realistic=args.realistic, lr=args.lr, threads=args.threads or None, smoke=args.smoke,
                        backend=args.backend,
                        plots=not args.no_plots, progress=lambda line: print(line, flush=True), command=command)
    print("wrote " + ", ".join(result["files"]))
    return 0
