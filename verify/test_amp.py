"""Area 4, AMP: the GradScaler state machine on every available device (CPU always, CUDA when present).

READY -> UNSCALED -> STEPPED -> READY; each misuse raises its documented error (torch 2.13 wording,
verify_semantics 1.2); a non-finite gradient skips the step (parameters bitwise unchanged) and backs the
scale off; the scale grows after ``growth_interval`` clean steps and never to inf; ``state_dict``
round-trips; ``enabled=False`` is a passthrough; and a scaled training run with ``unscale_`` +
``clip_grad_norm_`` matches the unscaled run bitwise (scales are powers of two, so unscaling is exact).
"""

from __future__ import annotations

import pickle
import re

import pytest
import torch
from torch.amp.grad_scaler import OptState

pytestmark = pytest.mark.amp
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def setup(device: str, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def batch(device: str, i: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(32, 8, generator=g).to(device), torch.randn(32, 4, generator=g).to(device)


def loss_of(model: torch.nn.Module, device: str, i: int = 0) -> torch.Tensor:
    x, y = batch(device, i)
    return torch.nn.functional.mse_loss(model(x), y)


def stage(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer) -> OptState:
    return scaler._per_optimizer_states[id(opt)]["stage"]


def snapshot(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("device", DEVICES)
def test_scaler_is_enabled_on_device(device: str) -> None:
    scaler = torch.amp.GradScaler(device, init_scale=1024.0)
    assert scaler.is_enabled(), f"GradScaler({device!r}) disabled itself"
    model, _ = setup(device)
    scaled = scaler.scale(loss_of(model, device))
    assert scaled.device.type == device
    assert scaler.get_scale() == 1024.0


@pytest.mark.parametrize("device", DEVICES)
def test_state_machine(device: str) -> None:
    scaler = torch.amp.GradScaler(device)
    model, opt = setup(device)
    scaler.scale(loss_of(model, device)).backward()
    assert stage(scaler, opt) is OptState.READY
    scaler.unscale_(opt)
    assert stage(scaler, opt) is OptState.UNSCALED
    scaler.step(opt)
    assert stage(scaler, opt) is OptState.STEPPED
    scaler.update()
    assert stage(scaler, opt) is OptState.READY
    # READY --step--> STEPPED directly (step unscales internally).
    opt.zero_grad()
    scaler.scale(loss_of(model, device, 1)).backward()
    scaler.step(opt)
    assert stage(scaler, opt) is OptState.STEPPED
    scaler.update()
    assert stage(scaler, opt) is OptState.READY


def _unscale_twice(scaler, opt) -> None:  # noqa: ANN001
    scaler.unscale_(opt)
    scaler.unscale_(opt)


def _unscale_after_step(scaler, opt) -> None:  # noqa: ANN001
    scaler.step(opt)
    scaler.unscale_(opt)


def _step_twice(scaler, opt) -> None:  # noqa: ANN001
    scaler.step(opt)
    scaler.step(opt)


MISUSES = [
    (
        _unscale_twice,
        RuntimeError,
        "unscale_() has already been called on this optimizer since the last update().",
    ),
    (_unscale_after_step, RuntimeError, "unscale_() is being called after step()."),
    (_step_twice, RuntimeError, "step() has already been called since the last update()."),
    (
        lambda s, o: s.step(o, closure=lambda: 0.0),
        RuntimeError,
        "Closure use is not currently supported if GradScaler is enabled.",
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("misuse", "exc", "message"),
    MISUSES,
    ids=["unscale-twice", "unscale-after-step", "step-twice", "closure"],
)
def test_misuse_raises_documented_error(device: str, misuse, exc: type, message: str) -> None:  # noqa: ANN001
    scaler = torch.amp.GradScaler(device)
    model, opt = setup(device)
    scaler.scale(loss_of(model, device)).backward()
    with pytest.raises(exc, match=re.escape(message)):
        misuse(scaler, opt)


@pytest.mark.parametrize("device", DEVICES)
def test_misuse_before_scale_and_update_without_step(device: str) -> None:
    scaler = torch.amp.GradScaler(device)
    model, opt = setup(device)
    loss_of(model, device).backward()
    with pytest.raises(
        AssertionError, match=re.escape("_scale is None.  This may indicate your script did not use")
    ):
        scaler.step(opt)
    scaler.scale(loss_of(model, device))
    with pytest.raises(AssertionError, match=re.escape("No inf checks were recorded prior to update.")):
        scaler.update()
    with pytest.raises(RuntimeError, match=re.escape("The source state dict is empty")):
        scaler.load_state_dict({})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_nonfinite_grad_skips_step_and_backs_off(device: str, bad: float) -> None:
    scaler = torch.amp.GradScaler(device, init_scale=1024.0, growth_interval=1)
    model, opt = setup(device)
    before = snapshot(model)
    scaler.scale(loss_of(model, device)).backward()
    next(model.parameters()).grad.view(-1)[0] = bad
    assert scaler.step(opt) is None, "step() ran the optimizer despite a non-finite gradient"
    scaler.update()
    for b, p in zip(before, model.parameters(), strict=True):
        assert torch.equal(b, p), "parameters changed although the step should have been skipped"
    assert scaler.get_scale() == 512.0
    assert int(scaler._get_growth_tracker()) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_growth_and_backoff_sequence(device: str) -> None:
    """init_scale=8, growth_interval=3, inf injected at iteration 4 (verify_semantics 1.4)."""
    scaler = torch.amp.GradScaler(device, init_scale=8.0, growth_interval=3)
    model, opt = setup(device)
    seen = []
    for i in range(7):
        opt.zero_grad()
        scaler.scale(loss_of(model, device, i)).backward()
        if i == 4:
            next(model.parameters()).grad.view(-1)[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        seen.append((i, scaler.get_scale(), int(scaler._get_growth_tracker())))
    assert seen == [(0, 8, 1), (1, 8, 2), (2, 16, 0), (3, 16, 1), (4, 8, 0), (5, 8, 1), (6, 8, 2)]


@pytest.mark.parametrize("device", DEVICES)
def test_scale_never_grows_to_inf(device: str) -> None:
    scaler = torch.amp.GradScaler(device, init_scale=2.0**127, growth_factor=2.0, growth_interval=1)
    model, opt = setup(device)
    scaler.scale(loss_of(model, device)).backward()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # finite grads: the step counts as clean
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**127
    assert int(scaler._get_growth_tracker()) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_round_trip(device: str) -> None:
    scaler = torch.amp.GradScaler(
        device, init_scale=64.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2
    )
    model, opt = setup(device)
    scaler.scale(loss_of(model, device)).backward()
    scaler.step(opt)
    scaler.update()
    state = scaler.state_dict()
    assert state == {
        "scale": 64.0,
        "growth_factor": 4.0,
        "backoff_factor": 0.25,
        "growth_interval": 2,
        "_growth_tracker": 1,
    }
    other = torch.amp.GradScaler(device)
    other.load_state_dict(state)
    assert other.state_dict() == state
    assert other.get_scale() == 64.0
    revived = pickle.loads(pickle.dumps(scaler))
    assert revived.state_dict() == state
    # Both continue identically: one more clean step grows the scale (tracker 1 -> interval 2).
    for s in (scaler, other, revived):
        opt.zero_grad()
        s.scale(loss_of(model, device, 1)).backward()
        s.unscale_(opt)
        s.update()
        assert s.get_scale() == 256.0


@pytest.mark.parametrize("device", DEVICES)
def test_disabled_scaler_is_passthrough(device: str) -> None:
    scaler = torch.amp.GradScaler(device, enabled=False)
    model, opt = setup(device)
    loss = loss_of(model, device)
    assert scaler.scale(loss) is loss
    loss.backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.step(opt)  # no state machine when disabled: a second step does not raise
    scaler.update()
    assert scaler.get_scale() == 1.0
    assert scaler.state_dict() == {}


def _train(
    device: str, scaler: torch.amp.GradScaler | None, optimizer: str
) -> tuple[list[torch.Tensor], float]:
    """4 iterations, inf injected at iteration 2, grads clipped to norm 0.5 (after unscale_ when scaled)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    for i in range(4):
        opt.zero_grad()
        loss = loss_of(model, device, i)
        if scaler is None:
            loss.backward()
            if i == 2:
                continue  # the scaled run skips this step because of the injected inf
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
        else:
            scaler.scale(loss).backward()
            if i == 2:
                next(model.parameters()).grad.view(-1)[0] = float("inf")
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
    return snapshot(model), scaler.get_scale() if scaler is not None else 1.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer", ["sgd", "adam-fused"])
def test_scaled_training_matches_unscaled(device: str, optimizer: str) -> None:
    control, _ = _train(device, None, optimizer)
    scaled, scale = _train(
        device, torch.amp.GradScaler(device, init_scale=128.0, growth_interval=1), optimizer
    )
    assert scale == 128.0 * 2**3 * 0.5
    for c, s in zip(control, scaled, strict=True):
        assert torch.equal(c, s), f"scaled training differs from unscaled by {(c - s).abs().max().item()}"
