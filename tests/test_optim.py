"""fleetrl's optimizers are torch's, bit for bit, and a run that does not compile never imports torch._dynamo (which
costs every process 1.4 s of CPU at its start: fleetrl/optim.py)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import torch

from fleetrl import optim

from conftest import fleetrl_env


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


def _train(net, optimizer, steps: int, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        net(torch.randn(32, 4, generator=generator)).pow(2).mean().backward()
        optimizer.step()


@pytest.mark.parametrize("fused", [True, False])
def test_adam_trains_bit_for_bit_as_torchs_and_their_state_dicts_load_into_each_other(fused):
    ours, theirs = _net(), _net()
    ours_opt = optim.Adam(ours.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    theirs_opt = torch.optim.Adam(theirs.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    _train(ours, ours_opt, 20)
    _train(theirs, theirs_opt, 20)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))

    # a checkpoint's optimizer state moves either way and training goes on identically
    resumed_ours, resumed_theirs = _net(), _net()
    resumed_ours.load_state_dict(theirs.state_dict())
    resumed_theirs.load_state_dict(ours.state_dict())
    ours_again = optim.Adam(resumed_ours.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    theirs_again = torch.optim.Adam(resumed_theirs.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    ours_again.load_state_dict(theirs_opt.state_dict())
    theirs_again.load_state_dict(ours_opt.state_dict())
    _train(resumed_ours, ours_again, 5, seed=2)
    _train(resumed_theirs, theirs_again, 5, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(resumed_ours.parameters(), resumed_theirs.parameters()))


def test_sgd_steps_as_torchs():
    ours, theirs = _net(), _net()
    _train(ours, optim.SGD(ours.parameters(), lr=0.1, momentum=0.9), 10)
    _train(theirs, torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9), 10)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))


def _pqn_net() -> torch.nn.Module:
    from fleetrl.nets import layernorm_mlp

    torch.manual_seed(0)
    return layernorm_mlp(4, 2)  # PQN's 120-84 LayerNorm MLP, its 7 tensors


def _pqn_updates(net, optimizer, steps: int, seed: int) -> None:
    """PQN's update as pqn.py runs it: zero_grad, backward, clip_grad_norm_ (in place on .grad), an annealed lr, step."""
    generator = torch.Generator().manual_seed(seed)
    for i in range(steps):
        optimizer.param_groups[0]["lr"] = 2.5e-4 * (1 - i / steps)
        obs, returns = torch.randn(128, 4, generator=generator) * 3, torch.randn(128, generator=generator) * 10
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(returns, net(obs)[:, 0]).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
        optimizer.step()


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_radam_steps_bit_for_bit_as_torchs_over_its_flat_buffer_and_their_state_dicts_load_into_each_other():
    ours, theirs = _pqn_net(), _pqn_net()
    ours_opt = optim.RAdam(ours.parameters(), lr=2.5e-4)
    theirs_opt = torch.optim.RAdam(theirs.parameters(), lr=2.5e-4)
    _pqn_updates(ours, ours_opt, 60, seed=1)  # past step 5, where RAdam's rectified branch starts
    _pqn_updates(theirs, theirs_opt, 60, seed=1)
    assert _same(ours, theirs)
    # the gradients are views of one flat buffer, which the step reads
    assert ours[0].weight.grad.data_ptr() == ours_opt._flat_grad.data_ptr()

    # a checkpoint's optimizer state moves either way (through torch.save) and training goes on identically
    def saved(obj):
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True)

    resumed_ours, resumed_theirs = _pqn_net(), _pqn_net()
    resumed_ours.load_state_dict(saved(theirs.state_dict()))
    resumed_theirs.load_state_dict(saved(ours.state_dict()))
    ours_again = optim.RAdam(resumed_ours.parameters(), lr=2.5e-4)
    theirs_again = torch.optim.RAdam(resumed_theirs.parameters(), lr=2.5e-4)
    ours_again.load_state_dict(saved(theirs_opt.state_dict()))
    theirs_again.load_state_dict(saved(ours_opt.state_dict()))
    assert ours_again.state[resumed_ours[0].weight]["exp_avg"].data_ptr() == ours_again._exp_avg.data_ptr()
    for net, opt in ((resumed_ours, ours_again), (resumed_theirs, theirs_again), (ours, ours_opt), (theirs, theirs_opt)):
        _pqn_updates(net, opt, 10, seed=2)
    assert _same(resumed_ours, resumed_theirs) and _same(resumed_ours, theirs) and _same(ours, theirs)


def _cnn() -> torch.nn.Module:
    torch.manual_seed(0)  # a Nature-CNN-shaped network in small: 4-D convolution weights, a LayerNorm, a linear head
    return torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3), torch.nn.Flatten(),
                               torch.nn.LayerNorm(8 * 5 * 5), torch.nn.Linear(8 * 5 * 5, 3))


def _cnn_updates(net, optimizer, steps: int, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        net(torch.randn(16, 4, 15, 15, generator=generator).to(memory_format=torch.channels_last)).pow(2).mean().backward()
        optimizer.step()


def test_radam_keeps_channels_last_weights_channels_last_and_steps_them_as_torchs():
    # fleetrl/accel.py chooses channels-last for a CNN before PQN builds its optimizer: the weights must stay in that
    # layout (the one the start-up line and the checkpoint report), their gradients too, and the arithmetic torch's
    ours, theirs = (_cnn().to(memory_format=torch.channels_last) for _ in range(2))
    strides = [p.stride() for p in ours.parameters()]
    ours_opt = optim.RAdam(ours.parameters(), lr=1e-3)
    theirs_opt = torch.optim.RAdam(theirs.parameters(), lr=1e-3)
    assert ours[0].weight.is_contiguous(memory_format=torch.channels_last) and not ours[0].weight.is_contiguous()
    _cnn_updates(ours, ours_opt, 8)  # past step 5, where RAdam's rectified branch starts
    _cnn_updates(theirs, theirs_opt, 8)
    assert [p.stride() for p in ours.parameters()] == strides == [p.grad.stride() for p in ours.parameters()]
    assert _same(ours, theirs)

    # a checkpoint of them (through torch.save) resumes into a fresh channels-last network, which goes on identically
    buffer = io.BytesIO()
    torch.save({"model": ours.state_dict(), "optimizer": ours_opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = _cnn().to(memory_format=torch.channels_last)
    resumed.load_state_dict(saved["model"])
    resumed_opt = optim.RAdam(resumed.parameters(), lr=1e-3)
    resumed_opt.load_state_dict(saved["optimizer"])
    _cnn_updates(resumed, resumed_opt, 3, seed=2)
    _cnn_updates(theirs, theirs_opt, 3, seed=2)
    assert [p.stride() for p in resumed.parameters()] == strides and _same(resumed, theirs)


def test_radam_updates_the_parameters_in_place_so_what_captured_them_before_it_acts_with_every_update():
    # the acting engine captures detached views of the parameters when the sampler is built (fleetrl/sampling/acting.py
    # host_q_values), a module copy shares them, a compiled function closes over them: whichever was built before the
    # optimizer must see each step
    net = _pqn_net()
    captured = [p.detach() for p in net.parameters()]
    initial = [t.clone() for t in captured]
    opt = optim.RAdam(net.parameters(), lr=2.5e-4)
    _pqn_updates(net, opt, 3, seed=1)
    for seen, param, before in zip(captured, net.parameters(), initial):
        assert not torch.equal(param, before), "the step moved every parameter"
        assert torch.equal(seen, param) and seen.data_ptr() == param.data_ptr()


def test_radam_steps_as_torchs_whatever_replaced_the_gradients_or_the_layout_after_it_was_built():
    # a module's own zero_grad() sets .grad to None and the next backward makes fresh tensors; a memory-format change
    # after the optimizer (Accel.apply called later) rebinds parameters and gradients: the step still reads the
    # gradients the parameters hold, and the parameters keep the layout they were given
    ours, theirs = _cnn(), _cnn()
    ours_opt = optim.RAdam(ours.parameters(), lr=1e-3)
    theirs_opt = torch.optim.RAdam(theirs.parameters(), lr=1e-3)
    _cnn_updates(ours, ours_opt, 2)
    _cnn_updates(theirs, theirs_opt, 2)
    for net in (ours, theirs):
        net.to(memory_format=torch.channels_last)
    generator = torch.Generator().manual_seed(3)
    for i in range(6):
        x = torch.randn(16, 4, 15, 15, generator=generator)
        for net, opt in ((ours, ours_opt), (theirs, theirs_opt)):
            # first the optimizer's zero_grad after the rebinding, then a module's (set_to_none), in turns
            (net.zero_grad if i % 2 else opt.zero_grad)()
            net(x).pow(2).mean().backward()
            opt.step()
    assert ours[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert all(p.grad.stride() == p.stride() and p.grad.data_ptr() >= ours_opt._flat_grad.data_ptr() for p in ours.parameters())
    assert _same(ours, theirs)


def test_radam_refuses_what_its_flat_step_does_not_do():
    with pytest.raises(ValueError, match="one parameter group"):
        optim.RAdam([{"params": [torch.nn.Parameter(torch.zeros(2))]}, {"params": [torch.nn.Parameter(torch.zeros(2))]}])
    opt = optim.RAdam([torch.nn.Parameter(torch.zeros(2))])
    opt.param_groups[0]["weight_decay"] = 0.1
    with pytest.raises(ValueError, match="weight decay"):
        opt.step()


PPO_CNN_PROBE = ["ppo", "--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "1",
                 "--update-epochs", "1", "--total-timesteps", "32", "--precision", "fp32"]


@pytest.mark.parametrize("runs", [
    # a CNN at fp32 has a memory format to measure on every CPU (an MLP's only choice, bf16, exists only where the CPU
    # runs bf16 natively), so PPO's precision probe trains here on any host
    pytest.param([PPO_CNN_PROBE], id="ppo-cnn-precision-probe", marks=pytest.mark.cpu_choice),
    # the three optimizers' algorithms one after another in one process (one torch import, not three); each says
    # after its run whether torch._dynamo is loaded yet, so the first that imports it is named
    pytest.param([["ppo", "--env-id", "CartPole-v1", "--total-timesteps", "512"],
                  ["dqn", "--env-id", "CartPole-v1", "--total-timesteps", "600", "--learning-starts", "500"],
                  ["pqn", "--env-id", "CartPole-v1", "--total-timesteps", "512"]], id="ppo-mlp-then-dqn-then-pqn-radam"),
])
def test_a_run_that_does_not_compile_never_imports_torch_dynamo(runs, tmp_path):
    # in a fresh process with a fresh cache of measured settings, so PPO's precision probe trains too
    code = ("import json, sys; from fleetrl.cli import main\n"
            "for i, argv in enumerate(json.loads(sys.argv[1])):\n"
            "    try:\n        main(['train', *argv, '--run-dir', f'{sys.argv[2]}/{i}'])\n"
            "    except SystemExit as e:\n        assert not e.code, (argv, e.code)\n"
            "    print(argv[0], 'torch._dynamo imported:', 'torch._dynamo' in sys.modules, flush=True)")
    runs = [[*flags, "--no-cuda", "--no-progress"] for flags in runs]
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(runs), str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=300, env={**fleetrl_env(1), "FLEETRL_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    if runs[0][0] == "ppo" and "--precision" in runs[0]:  # the precision probe's training steps ran in this process too
        assert "precision:" in proc.stdout and "measured" in proc.stdout and "before" not in proc.stdout, proc.stdout
    said = [line for line in proc.stdout.splitlines() if "torch._dynamo imported:" in line]
    assert said == [f"{flags[0]} torch._dynamo imported: False" for flags in runs], proc.stdout[-2000:]
