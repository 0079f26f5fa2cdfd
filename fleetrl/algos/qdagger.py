"""QDagger ("reincarnating" RL) for discrete actions, classic control and Atari, read top to bottom as CleanRL's
qdagger_dqn_atari_impalacnn.py: a student DQN starts from a teacher's policy and its rollouts.

Order: arguments, networks (CleanRL's IMPALA CNN student for Atari; fleetrl's DQN MLP for vector observations; the
teacher is a fleetrl DQN checkpoint, ``--teacher-checkpoint``), the distillation loss, then training in CleanRL's three
phases: (1) the teacher's epsilon-greedy rollouts fill a replay buffer; (2) the student trains offline on it, TD loss
plus the teacher's KL at weight 1; (3) the student trains online with a fresh buffer, the KL weighted by
``distill_coeff``: 1 until 10 online episodes have ended, then ``max(1 - mean(last 10 returns) / mean(teacher's
eval returns), 0)``. The engine (vector envs, replay buffer, checkpoints, monitoring) is called in a line each.

The run is one sequence of iterations: the teacher's (``--teacher-steps`` env steps), the offline ones
(``--offline-steps`` gradient steps, 100 an iteration) and the online ones (``--total-timesteps`` env steps), so a
checkpoint's iteration says the phase and the position in it, and ``--resume`` continues there. The x-axis of the logs
(the engine's global step) counts them in turn; CleanRL's own clock of phases 2 and 3 (the offline step, then
``offline_steps + i`` online, which drives epsilon and the cadences) is that step less the teacher's steps.

Differences from CleanRL, each on purpose:
* the teacher is a fleetrl DQN checkpoint of the same env, not a Hugging Face download; it is evaluated for
  --teacher-eval-episodes episodes as ``fleetrl eval --stochastic`` would, epsilon-greedy with this run's --end-e
  (CleanRL's evaluate with ``epsilon=end_e``), from torch's RNG rather than Python's ``random``;
* DQN's (dqn.py): exploration draws from numpy's global RNG, fused Adam, the true next observation at a time limit in
  the buffer (SB3's ``optimize_memory_usage`` buffer loses it), Atari frames stored once;
* classic control has defaults of its own (CleanRL's file is Atari-only): teacher and offline phases of 5,000 steps,
  so the teacher's rollouts cost a small part of what DQN from scratch needs;
* one process (CleanRL asserts one env; fleetrl takes --num-envs, not torchrun: the distillation weight reads the
  last 10 returns as each episode ends, which ranks would see apart);
* a resume without --save-buffer in phase 1 or 2 first redoes the teacher's rollouts (the offline step is kept); in
  phase 3 it refills the online buffer for --learning-starts steps, as DQN's does.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fleetrl import checkpoint, config, offpolicy, optim
from fleetrl.algos import dqn
from fleetrl.algos.dqn import linear_schedule
from fleetrl.algos.source import train_main
from fleetrl.args import validate_offpolicy
from fleetrl.envs import make_vector_env
from fleetrl.envs.vector import episode_stats
from fleetrl.errors import FleetError
from fleetrl.monitor import TrainResult
from fleetrl.offpolicy import STEPS_PER_ITERATION, epsilon_greedy, optimizer_step, soft_update, step_envs, times_due
from fleetrl.policy import policy_fn
from fleetrl.run import Run
from fleetrl.sampling.acting import host_forward
from fleetrl.sampling.replay import ReplayBatch


# ============================================================================ arguments
@dataclass
class Args(dqn.Args):
    """DQN's flags (dqn.py) with QDagger's; None means "the default for the env family" (see FAMILY_DEFAULTS)."""

    exp_name: str = "qdagger"
    """the name of this experiment"""
    total_timesteps: int | None = None
    """total timesteps of the online phase [100k classic control; Atari 10M]"""
    exploration_fraction: float | None = None
    """the fraction of `total-timesteps` it takes from start-e to go end-e, counted from step 0 of the offline phase [0.1]"""
    learning_starts: int | None = None
    """timestep to start learning, on the offline-and-online clock [1k classic control; Atari 80k]"""
    policy_lag: int = 0
    """DQN's flag; QDagger updates in this process only (0)"""

    # QDagger specific arguments
    teacher_checkpoint: str | None = None
    """the teacher: a fleetrl DQN checkpoint file or run folder, trained on this env (CleanRL: --teacher-policy-hf-repo)"""
    teacher_eval_episodes: int = 10
    """the number of episodes to run the teacher policy evaluate"""
    teacher_steps: int | None = None
    """the number of steps to run the teacher policy to generate the replay buffer [5k classic control; Atari 500k]"""
    offline_steps: int | None = None
    """the number of steps to run the student policy with the teacher's replay buffer [5k classic control; Atari 500k]"""
    temperature: float = 1.0
    """the temperature parameter for qdagger"""


FAMILY_DEFAULTS = {  # Atari: CleanRL's qdagger_dqn_atari_impalacnn.py; classic control: DQN's dqn.py with short teacher phases
    "classic": dict(total_timesteps=100_000, learning_rate=2.5e-4, num_envs=1, buffer_size=10_000, tau=1.0, target_network_frequency=500,
                    batch_size=128, end_e=0.05, exploration_fraction=0.1, learning_starts=1_000, train_frequency=10,
                    teacher_steps=5_000, offline_steps=5_000),
    "atari": dict(total_timesteps=10_000_000, learning_rate=1e-4, num_envs=1, buffer_size=1_000_000, tau=1.0, target_network_frequency=1000,
                  batch_size=32, end_e=0.01, exploration_fraction=0.1, learning_starts=80_000, train_frequency=4,
                  teacher_steps=500_000, offline_steps=500_000),
}
AGENT_ROWS = False
OFFLINE_EVAL_EVERY = 100_000  # CleanRL evaluates the student every 100,000 offline steps (step 0 too)
DISTILL_WINDOW = 10  # online episodes whose mean return sets the distillation weight

RANGES = {
    **dqn.RANGES,
    "policy_lag": config.count("DQN's learner process; QDagger updates in this process", low=0, high=0),
    "teacher_eval_episodes": config.count("episodes the teacher is evaluated for"),
    "teacher_steps": config.count("env steps of the teacher's rollouts"),
    "offline_steps": config.count("gradient steps on the teacher's rollouts"),
    "temperature": config.positive("the distillation's softmax temperature", config.COEF_MAX),
}


def validate(args: Args, world_size: int = 1) -> None:
    """Refuse a configuration that cannot run, before anything starts."""
    if world_size > 1:
        raise FleetError(f"QDagger runs in one process, not under torchrun ({world_size} processes here): its distillation weight "
                         "reads the last 10 returns as each episode ends. Run it without torchrun (--num-envs sets the envs).")
    validate_offpolicy(args, world_size, RANGES)
    if args.teacher_checkpoint is None:
        raise FleetError("QDagger needs a teacher: pass --teacher-checkpoint PATH, a fleetrl DQN checkpoint file or run folder "
                         f"trained on {args.env_id} (train one with `fleetrl train dqn --env-id {args.env_id}`).")
    per_iteration = args.num_envs * STEPS_PER_ITERATION
    for flag, steps, unit in (("--teacher-steps", args.teacher_steps, per_iteration), ("--offline-steps", args.offline_steps, STEPS_PER_ITERATION),
                              ("--total-timesteps", args.total_timesteps, per_iteration)):
        if steps % unit:
            raise FleetError(f"{flag} {steps} is not a whole number of iterations of {unit} steps ({STEPS_PER_ITERATION} steps of each "
                             f"of --num-envs {args.num_envs} envs{'' if unit == per_iteration else '; offline: 100 gradient steps'}): "
                             f"a checkpoint marks a phase's position by iterations. Use a multiple of {unit}.")
    if args.teacher_steps > args.buffer_size:
        raise FleetError(f"--teacher-steps {args.teacher_steps} is more than --buffer-size {args.buffer_size}: the offline phase would "
                         f"train on the last {args.buffer_size} only. Raise --buffer-size or lower --teacher-steps.")


# ============================================================================ networks
class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(in_channels=channels, out_channels=channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(in_channels=channels, out_channels=channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs = x
        x = nn.functional.relu(x)
        x = self.conv0(x)
        x = nn.functional.relu(x)
        x = self.conv1(x)
        return x + inputs


class ConvSequence(nn.Module):
    def __init__(self, input_shape: tuple[int, int, int], out_channels: int):
        super().__init__()
        self._input_shape = input_shape
        self._out_channels = out_channels
        self.conv = nn.Conv2d(in_channels=self._input_shape[0], out_channels=self._out_channels, kernel_size=3, padding=1)
        self.res_block0 = ResidualBlock(self._out_channels)
        self.res_block1 = ResidualBlock(self._out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = nn.functional.max_pool2d(x, kernel_size=3, stride=2, padding=1)
        x = self.res_block0(x)
        x = self.res_block1(x)
        return x

    def get_output_shape(self) -> tuple[int, int, int]:
        _c, h, w = self._input_shape
        return (self._out_channels, (h + 1) // 2, (w + 1) // 2)


class ImpalaQNetwork(nn.Module):
    """CleanRL's QDagger student for Atari: the IMPALA CNN (three ConvSequences of 16, 32, 32 channels), 256 units, one
    value per action; uint8 frames in, scaled inside. It acts, and evaluates, as DQN's QNetwork does."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int):
        super().__init__()
        shape = tuple(obs_shape)
        conv_seqs: list[nn.Module] = []
        for out_channels in [16, 32, 32]:
            conv_seq = ConvSequence(shape, out_channels)
            shape = conv_seq.get_output_shape()
            conv_seqs.append(conv_seq)
        conv_seqs += [
            nn.Flatten(),
            nn.ReLU(),
            nn.Linear(in_features=shape[0] * shape[1] * shape[2], out_features=256),
            nn.ReLU(),
            nn.Linear(in_features=256, out_features=num_actions),
        ]
        self.network = nn.Sequential(*conv_seqs)
        self.num_actions = num_actions
        self.epsilon = 0.0  # the exploration of stochastic evaluation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x / 255.0)

    def q_values_on_host(self, device: torch.device) -> Callable[[np.ndarray], np.ndarray]:
        """numpy frames -> numpy Q-values, through ``forward`` (its scaling is not in ``self.network``)."""
        return host_forward(self, device)

    act = dqn.QNetwork.act  # greedy, or epsilon-greedy


def make_student(obs_shape: tuple[int, ...], num_actions: int) -> nn.Module:
    """The student: CleanRL's IMPALA CNN on stacked frames, DQN's MLP 120-84 on vector observations."""
    return ImpalaQNetwork(obs_shape, num_actions) if len(obs_shape) == 3 else dqn.QNetwork(obs_shape, num_actions)


def load_teacher(path: str, env_id: str, obs_shape: tuple[int, ...], num_actions: int, device: torch.device) -> dqn.QNetwork:
    """The teacher: the DQN network of a fleetrl DQN checkpoint (file or run folder) of this env, verified."""
    need = (f"QDagger's teacher (--teacher-checkpoint) must be a fleetrl DQN checkpoint, a file or run folder that verifies, "
            f"trained on {env_id}: train one with `fleetrl train dqn --env-id {env_id}`, or pass another.")
    try:
        state, found = checkpoint.load_checkpoint_and_path(path)
    except FleetError as exc:
        raise FleetError(f"The teacher checkpoint {path} cannot be used: {str(exc).rstrip('.')}. {need}") from None
    if state.get("algo") != "dqn":
        raise FleetError(f"The teacher checkpoint {found} was written by {state.get('algo') or 'an unknown algorithm'}, not dqn. {need}")
    teacher_env = state.get("args", {}).get("env_id")
    if teacher_env != env_id:
        raise FleetError(f"The teacher checkpoint {found} was trained on {teacher_env}, not {env_id}: its Q-values mean nothing "
                         f"here. {need}")
    teacher = dqn.QNetwork(obs_shape, num_actions).to(device)
    try:
        teacher.load_state_dict(state["q_network"])
    except (KeyError, RuntimeError) as exc:
        raise FleetError(f"The teacher checkpoint {found} holds no DQN network that fits {env_id} ({str(exc).splitlines()[0]}). {need}") from None
    teacher.eval()
    return teacher


def evaluate(network: nn.Module, run: Run, episodes: int, epsilon: float) -> list[float]:
    """``episodes`` returns of ``network``, epsilon-greedy, on one evaluation env of the run's env (no training-only
    wrappers), as CleanRL's dqn_eval.evaluate with ``epsilon``; ``fleetrl eval --stochastic``'s acting."""
    envs = make_vector_env(run.args.env_id, 1, "sync", training=False, sticky_actions=run.args.sticky_actions, family=run.family)
    saved_epsilon, was_training = network.epsilon, network.training
    network.epsilon = epsilon
    try:
        policy, returns = policy_fn(network, envs, deterministic=False), []
        obs, _ = envs.reset(seed=run.args.seed)
        while len(returns) < episodes:
            obs, _, _, _, info = envs.step(policy(obs))
            returns += [episode_return for episode_return, _ in episode_stats(info)]
    finally:
        envs.close()
        network.epsilon = saved_epsilon
        network.train(was_training)
    return returns[:episodes]


# ============================================================================ loss
def kl_divergence_with_logits(target_logits: torch.Tensor, prediction_logits: torch.Tensor) -> torch.Tensor:
    """CleanRL's distillation loss: the KL of the student's softmax from the teacher's, summed over the batch and the
    actions (CleanRL then takes the mean of this scalar: the KL weighs batch-size times a per-sample mean)."""
    out = -F.softmax(target_logits, dim=-1) * (F.log_softmax(prediction_logits, dim=-1) - F.log_softmax(target_logits, dim=-1))
    return torch.sum(out)


def qdagger_loss(q_network: nn.Module, target_network: nn.Module, teacher: nn.Module, data: ReplayBatch, distill_coeff: float,
                 args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CleanRL's QDagger loss, both phases: the TD loss plus ``distill_coeff`` times the teacher's KL; its scalars."""
    with torch.no_grad():
        target_max, _ = target_network(data.next_obs).max(dim=1)
        td_target = data.rewards + args.gamma * target_max * (1 - data.dones)
        teacher_q_values = teacher(data.obs) / args.temperature
    student_q_values = q_network(data.obs)
    old_val = student_q_values.gather(1, data.actions.unsqueeze(1)).squeeze(1)
    q_loss = F.mse_loss(td_target, old_val)
    student_q_values = student_q_values / args.temperature
    distill_loss = torch.mean(kl_divergence_with_logits(teacher_q_values, student_q_values))
    loss = q_loss + distill_coeff * distill_loss
    return loss, {"loss": loss.detach(), "td_loss": q_loss.detach(), "distill_loss": distill_loss.detach(),
                  "q_values": old_val.detach().mean()}


@dataclass
class Distillation:
    """What sets the distillation weight, kept in every checkpoint: the teacher's evaluation returns and the last
    ``DISTILL_WINDOW`` online returns."""

    teacher_returns: list[float]
    online_returns: deque

    def coeff(self) -> float:
        """CleanRL's schedule: 1 until ``DISTILL_WINDOW`` online episodes ended, then 1 - student / teacher, at least 0."""
        if len(self.online_returns) < DISTILL_WINDOW:
            return 1.0
        return max(1 - np.mean(self.online_returns) / np.mean(self.teacher_returns), 0)

    def state_dict(self) -> dict[str, Any]:
        return {"teacher_returns": list(self.teacher_returns), "online_returns": list(self.online_returns)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.teacher_returns = list(state["teacher_returns"])
        self.online_returns = deque(state["online_returns"], maxlen=DISTILL_WINDOW)


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """Train a QDagger student from ``--teacher-checkpoint``, in CleanRL's three phases, in one process. ``explicit``:
    the flags given on the command line (they win over a resumed run's saved arguments)."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    # resume, defaults, seeds, device, stop signals; everything opened below is closed however the run ends
    with Run.start(args, explicit, FAMILY_DEFAULTS, validate, algo="qdagger") as run:
        args, dist, device = run.args, run.dist, run.device
        envs = run.make_envs()  # a continuous action space was refused here
        obs_shape, num_actions, num_envs = envs.single_observation_space.shape, int(envs.single_action_space.n), run.local_num_envs
        teacher_iterations = args.teacher_steps // (num_envs * STEPS_PER_ITERATION)
        offline_iterations = args.offline_steps // STEPS_PER_ITERATION
        online_from = teacher_iterations + offline_iterations  # the iterations before the online phase
        teacher_steps = args.teacher_steps  # where CleanRL's clock of phases 2 and 3 starts on the engine's

        q_network = make_student(obs_shape, num_actions).to(device)
        optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)  # one kernel for all params
        grad_sync = dist.gradient_sync(q_network.parameters())
        q_values_of = q_network.q_values_on_host(device)  # numpy -> numpy; small MLPs on the CPU act in numpy
        target_network = make_student(obs_shape, num_actions).to(device)
        target_network.load_state_dict(q_network.state_dict())

        # QDAGGER LOGIC: the teacher, evaluated as CleanRL does (epsilon = end_e); a resumed run keeps its returns
        teacher = load_teacher(args.teacher_checkpoint, args.env_id, obs_shape, num_actions, device)
        teacher_q_values_of = teacher.q_values_on_host(device)
        distill = Distillation([], deque(maxlen=DISTILL_WINDOW))
        if run.resumed is None:
            distill.teacher_returns = evaluate(teacher, run, args.teacher_eval_episodes, args.end_e)
        # the teacher's rollouts, then (phase 3) the online transitions: CleanRL's two buffers, one at a time
        rb = offpolicy.make_replay(run, envs)
        empty_buffer = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in rb.state_dict().items()}
        run.register(q_network=q_network, target_network=target_network, optimizer=optimizer, distillation=distill)
        log = run.start_logging(envs, online_from + offpolicy.num_iterations(args), STEPS_PER_ITERATION * num_envs)
        if run.resumed is None:
            log.logger.scalar("charts/teacher/avg_episodic_return", float(np.mean(distill.teacher_returns)), 0)
        run.restore()  # a resumed run: its networks, optimiser, distillation state and RNG streams, exactly as they were

        def update(data: ReplayBatch, distill_coeff: float) -> dict[str, torch.Tensor]:  # one gradient step
            loss, scalars = qdagger_loss(q_network, target_network, teacher, data, distill_coeff, args)
            optimizer_step(optimizer, grad_sync, loss)  # optimize the model
            return scalars

        def fill_from_teacher(obs: np.ndarray, step: int, vector_steps: int) -> np.ndarray:
            """The teacher's epsilon-greedy rollouts into the buffer (epsilon from start-e to end-e over --teacher-steps)."""
            for _ in range(vector_steps):
                epsilon = linear_schedule(args.start_e, args.end_e, args.teacher_steps, step)
                with log.timer.inference:
                    actions = epsilon_greedy(teacher_q_values_of, obs, epsilon, num_actions)
                obs = step_envs(envs, rb, obs, actions, step + num_envs, [], log.timer)  # the teacher's episodes are not the student's
                step += num_envs
            return obs

        step, obs = run.global_step, None  # the engine's clock: the teacher's env steps, then offline and online steps
        learning_starts = args.learning_starts
        offline_end = teacher_steps + args.offline_steps
        if offpolicy.learning_starts(run) > args.learning_starts:  # a resume without the buffer: refill it first
            if step < offline_end:
                done = min(step, teacher_steps)
                print(f"fleetrl: the checkpoint holds no replay buffer (train with --save-buffer for that): the teacher's rollouts run "
                      f"again for {done:,} steps before the run goes on.", file=sys.stderr, flush=True)
                obs = fill_from_teacher(envs.reset(seed=args.seed)[0], 0, done // num_envs)
            elif step > offline_end:  # online: as DQN's, learning waits --learning-starts steps more
                learning_starts = step - teacher_steps + args.learning_starts

        # TRY NOT TO MODIFY: start the game
        epsilon, distill_coeff, losses = args.start_e, 1.0, {}
        for iteration in run.iterations():  # to the last (from a resumed checkpoint's); --stop-at-return ends it early
            episodes, charts = [], {}
            if iteration <= teacher_iterations:
                # PHASE 1: collect teacher data for --teacher-steps (we assume we don't have access to the teacher's replay buffer)
                if obs is None:
                    obs, _ = envs.reset(seed=run.env_seed)
                obs = fill_from_teacher(obs, step, STEPS_PER_ITERATION)
                step += STEPS_PER_ITERATION * num_envs
            elif iteration <= online_from:
                # PHASE 2: offline training, the student on the teacher's replay buffer with the qdagger loss (weight 1)
                for _ in range(STEPS_PER_ITERATION):
                    offline_step = step - teacher_steps  # CleanRL's global_step of this phase
                    with log.timer.learn:
                        scalars = update(rb.sample(args.batch_size), 1.0)
                        if offline_step % args.target_network_frequency == 0:  # update the target network
                            soft_update(target_network, q_network, args.tau)
                    if offline_step % STEPS_PER_ITERATION == 0:
                        charts.update({f"offline/{name}": scalars[name] for name in ("loss", "td_loss", "distill_loss")})
                    if offline_step % OFFLINE_EVAL_EVERY == 0:  # evaluate the student
                        charts["offline/avg_episodic_return"] = float(np.mean(evaluate(q_network, run, 10, args.end_e)))
                    step += 1
                charts = {name: float(value) for name, value in charts.items()}
            else:
                # PHASE 3: online training with a fresh buffer and fresh episodes, CleanRL's clock going on from --offline-steps
                if iteration == online_from + 1:  # CleanRL's fresh buffer and envs, reset with --seed (a resume in phase 2 too)
                    rb.load_state_dict(empty_buffer)
                    obs, _ = envs.reset(seed=args.seed)
                elif obs is None:  # resumed within phase 3: new episodes, seeded apart by the step
                    obs, _ = envs.reset(seed=run.env_seed)
                for _ in range(STEPS_PER_ITERATION):
                    global_step = step - teacher_steps  # CleanRL's: offline_steps + the online steps before this one
                    # ALGO LOGIC: epsilon-greedy over CleanRL's clock, so the online phase starts part-way down the schedule
                    epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step)
                    with log.timer.inference:
                        actions = epsilon_greedy(q_values_of, obs, epsilon, num_actions)

                    # TRY NOT TO MODIFY: execute the game, save the data to the replay buffer (the true next obs at a time limit)
                    finished: list = []
                    obs = step_envs(envs, rb, obs, actions, step + num_envs, finished, log.timer)
                    distill.online_returns.extend(episode_return for _, episode_return, _ in finished)
                    episodes += finished

                    # ALGO LOGIC: training, the teacher's KL weighted by how far the student's returns are below the teacher's
                    if global_step > learning_starts:
                        for _ in range(times_due(global_step, num_envs, args.train_frequency)):
                            distill_coeff = distill.coeff()
                            with log.timer.learn:
                                losses = update(rb.sample(args.batch_size), distill_coeff)
                        if times_due(global_step, num_envs, args.target_network_frequency):  # update the target network
                            soft_update(target_network, q_network, args.tau)
                    step += num_envs
                charts = {"epsilon": epsilon, "distill_coeff": distill_coeff}
            run.end_iteration(iteration, step, episodes, losses=losses if iteration > online_from else None, charts=charts)
        return run.finish(q_network)


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The student as ``obs -> action``: greedy, or epsilon-greedy with the run's final epsilon."""
    q_network = make_student(envs.single_observation_space.shape, int(envs.single_action_space.n))
    q_network.load_state_dict(state["q_network"])
    q_network.eval()
    q_network.epsilon = float(state["args"]["end_e"])
    return policy_fn(q_network, envs, deterministic)


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
