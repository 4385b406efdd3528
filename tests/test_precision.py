"""precision=fp32|bf16|auto: bfloat16 matrix products with float32 output layers."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tests.conftest import TINY_PENDULUM, launch
from themis.agents.buffers import ReplayBufferSamples
from themis.agents.networks import EnsembleMLP, FullPrecisionLinear, mlp
from themis.agents.sac import SAC, SACConfig
from themis.builder import make_workspace
from themis.core.precision import autocast, cpu_has_bf16, flush_denormals, resolve_precision
from themis.reward.ensemble import RewardEnsemble

CPU = torch.device("cpu")


def test_full_precision_linear_is_nn_linear_bit_for_bit_outside_autocast():
    torch.manual_seed(0)
    plain, full = nn.Linear(7, 5), FullPrecisionLinear(7, 5)
    full.load_state_dict(plain.state_dict())
    x = torch.randn(11, 7)
    assert torch.equal(plain(x), full(x))


def test_output_layers_stay_float32_inside_bf16_autocast():
    torch.manual_seed(0)
    actor, ensemble = mlp(4, 32, 2, 2), EnsembleMLP(3, 4, 32, 1, 2)
    x = torch.randn(8, 4)
    with autocast(torch.bfloat16, CPU):
        hidden = actor[0](x)
        out, ens = actor(x), ensemble(x)
    assert hidden.dtype == torch.bfloat16  # the hidden matmuls run in bfloat16
    assert out.dtype == torch.float32 and ens.dtype == torch.float32
    # close to float32, not equal: bfloat16 rounds the hidden products
    assert torch.allclose(out, actor(x), atol=0.05) and not torch.equal(out, actor(x))


def test_an_ensemble_layer_on_shared_inputs_stays_bfloat16_inside_autocast():
    """A first ensemble layer (input ``(B, in)`` shared by the members) adds its bias in the
    product's dtype: no float32 ``(E, B, out)`` activations to cast back at the next layer."""
    torch.manual_seed(0)
    ensemble = EnsembleMLP(2, 4, 32, 1, 2)
    first = ensemble.net[0]
    x = torch.randn(8, 4)
    with autocast(torch.bfloat16, CPU):
        hidden = first(x)
    assert hidden.dtype == torch.bfloat16 and hidden.shape == (2, 8, 32)
    plain = torch.matmul(x, first.weight) + first.bias
    assert torch.equal(first(x), plain)  # outside autocast: the float32 formula, bit for bit
    assert torch.allclose(hidden.float(), plain, atol=0.05)


def test_a_one_unit_ensemble_layer_is_the_same_product_on_small_and_large_batches():
    """Small batches take the multiply-and-sum path, large ones ``baddbmm``: the same values
    and gradients up to float32 rounding, float32 outputs also from bfloat16 inputs."""
    from themis.agents.networks import EnsembleLinear

    torch.manual_seed(0)
    layer = EnsembleLinear(2, 64, 1, full_precision=True)
    small = torch.randn(2, 8, 64, requires_grad=True)
    assert small.numel() <= EnsembleLinear.SMALL_DOT
    reference = torch.baddbmm(layer.bias, small, layer.weight)
    out = layer(small)
    assert out.shape == (2, 8, 1) and torch.allclose(out, reference, atol=1e-5)
    grads = torch.autograd.grad(out.sum(), (small, layer.weight, layer.bias))
    expected = torch.autograd.grad(reference.sum(), (small, layer.weight, layer.bias))
    for got, want in zip(grads, expected, strict=True):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    shared = torch.randn(8, 64)  # (B, in) shared by the members
    assert torch.allclose(layer(shared), torch.matmul(shared, layer.weight) + layer.bias,
                          atol=1e-5)
    with autocast(torch.bfloat16, CPU):
        assert layer(small.detach().bfloat16()).dtype == torch.float32
    large = torch.randn(2, EnsembleLinear.SMALL_DOT // 64, 64)  # past the limit: baddbmm
    assert torch.equal(layer(large), torch.baddbmm(layer.bias, large, layer.weight))


def test_a_bf16_sac_update_keeps_float32_parameters_and_learns():
    torch.manual_seed(0)
    agent = SAC(5, 2, CPU, SACConfig(hidden_dim=64, batch_size=32), precision=torch.bfloat16)
    batch = ReplayBufferSamples(torch.randn(32, 5), torch.rand(32, 2) * 2 - 1,
                                torch.randn(32, 5), torch.full((32,), 3.0), torch.ones(32))
    first = float(agent.update(batch, 1)["critic_loss"])
    for step in range(2, 200):
        metrics = agent.update(batch, step)
    assert all(p.dtype == torch.float32 for p in agent.critic.parameters())
    assert float(metrics["critic_loss"]) < 0.1 * first  # regression onto the constant target


def test_reward_model_in_bf16_predicts_float32_close_to_fp32():
    torch.manual_seed(0)
    model = RewardEnsemble(6, 2, ensemble_size=3, hidden_dim=64)
    obs, act = torch.randn(100, 6), torch.rand(100, 2)
    exact = model(obs, act)
    model.precision = torch.bfloat16
    approx = model(obs, act)
    assert approx.dtype == torch.float32 and torch.allclose(approx, exact, atol=0.03)


def test_resolve_precision():
    assert resolve_precision("fp32", CPU) is None
    assert resolve_precision("bf16", CPU) is torch.bfloat16
    assert resolve_precision("auto", CPU) is (torch.bfloat16 if cpu_has_bf16() else None)
    assert resolve_precision("auto", torch.device("cuda")) is None
    with pytest.raises(ValueError, match="precision=fp16 is not one of auto, fp32, bf16"):
        resolve_precision("fp16", CPU)


SUBNORMAL = 1e-39  # below float32's smallest normal number, 1.18e-38


@pytest.fixture
def can_flush() -> bool:
    """Whether this CPU flushes subnormals (x86 with SSE3); probed, then kept as the test
    starts (conftest restores PyTorch's start state after every test)."""
    supported = torch.set_flush_denormal(True)
    torch.set_flush_denormal(False)
    return supported


def test_flush_denormals_turns_subnormal_arithmetic_to_zero_and_leaves_normal_numbers(
        can_flush):
    x = torch.tensor([SUBNORMAL, 1e-30, 1.0])
    assert (x * 1.0)[0] > 0  # kept: the subnormal survives a product
    assert flush_denormals() is can_flush
    flushed = x * 1.0
    assert bool(flushed[0] == 0) is can_flush
    assert flushed[1] == pytest.approx(1e-30) and flushed[2] == 1.0


def test_a_run_flushes_subnormals_and_adam_still_steps_as_before(compose, tmp_path, can_flush):
    if not can_flush:
        pytest.skip("this CPU cannot flush subnormals (not x86 with SSE3)")
    make_workspace(compose(TINY_PENDULUM), tmp_path)
    assert (torch.tensor([SUBNORMAL]) * 1.0)[0] == 0
    # Adam with the moments of a dead unit (subnormal) and of live ones: the live parameters
    # take the same step as with subnormals kept, the dead one none
    steps = []
    for flush in (False, True):
        torch.set_flush_denormal(flush)
        p = nn.Parameter(torch.zeros(3))
        opt = torch.optim.Adam([p], lr=1e-3)
        p.grad = torch.tensor([SUBNORMAL, 0.5, -2.0])
        opt.step()
        steps.append(p.detach().clone())
    assert torch.equal(steps[0][1:], steps[1][1:]) and steps[0][1:].abs().min() > 1e-4
    assert steps[1][0] == 0


def test_numpy_float_limits_measured_after_the_flush_do_not_warn(can_flush):
    """pandas imports numpy.ma, which measures np.finfo of every float type: with subnormals
    flushed and no cached limits NumPy would warn "the smallest subnormal ... is zero"."""
    flush_denormals()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kind in (np.half, np.single, np.double, np.longdouble):
            tiny = np.finfo(kind).smallest_subnormal  # its bits: comparing would flush it
            assert np.frombuffer(tiny.tobytes(), np.uint8).any()


def test_a_bf16_run_says_so_in_the_banner_and_trains(compose, tmp_path, capsys):
    ws = make_workspace(compose([*TINY_PENDULUM, "precision=bf16", "num_train_steps=700"]),
                        tmp_path)
    assert ws.agent.precision is torch.bfloat16 and ws.reward_model.precision is torch.bfloat16
    ws.run()
    out = capsys.readouterr()
    assert ", bf16 matmuls |" in out.out + out.err
    assert ws.learner.total_feedback > 0


def test_a_bad_precision_is_one_line_and_exit_2(tmp_path):
    proc = launch("themis_train.sh", "precision=fp16", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "precision=fp16 is not one of auto, fp32, bf16" in proc.stderr
