"""PPO with Random Network Distillation (PPO-RND), discrete actions, Atari and classic control, read top to bottom as
CleanRL's ppo_rnd_envpool.py, on PPO's engine (fleetrl/algos/ppo.py): its rollout, GAE and update are PPO's.

Order: arguments, the networks, curiosity (the intrinsic reward and its advantage), the loss, then training. A fixed
random target network embeds each next observation; a predictor learns to match it, and its error is the intrinsic
reward: high where the agent has seldom been. Two value heads learn the extrinsic and the intrinsic returns (the
intrinsic one never ends at an episode's end), and the policy follows ``--ext-coef`` x the extrinsic advantage +
``--int-coef`` x the intrinsic one. The predictor trains on a random ``--update-proportion`` of each minibatch.

Differences from CleanRL, each on purpose (besides PPO's, ppo.py):
* the intrinsic return's running discount (``RewardForwardFilter``) runs along each env's steps; CleanRL's runs along
  the envs (it iterates over the transposed rewards), and its variance counts every step of every env;
* a rollout's intrinsic rewards and values come from one batched pass after it, with the weights and statistics that
  acted (CleanRL's: step by step), and the target's features of the batch from one pass (CleanRL's: every epoch);
  the predictor runs on the --update-proportion rows its loss keeps (CleanRL's: on all, the rest's loss zeroed);
* classic control too, with 64-wide MLPs; Adam is fused.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fleetrl import config, onpolicy, optim
from fleetrl.accel import autocast
from fleetrl.algos import ppo
from fleetrl.algos.source import train_main
from fleetrl.errors import FleetError
from fleetrl.monitor import TrainResult
from fleetrl.nets import categorical_logprob_entropy, layer_init
from fleetrl.policy import policy_fn
from fleetrl.run import Run
from fleetrl.sampling.normalize import DiscountedSum, RunningMeanStd, stats_from_random_actions
from fleetrl.sampling.sampler import local_async_batch


# ============================================================================ arguments
@dataclass
class Args(ppo.Args):
    exp_name: str = "ppo_rnd"
    """the name of this experiment"""
    env_id: str = "ALE/MontezumaRevenge-v5"
    """the id of the environment, with discrete actions (`module.path:EnvId-v0` imports your module first)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""

    # RND arguments
    update_proportion: float = 0.25
    """proportion of exp used for predictor update"""
    int_coef: float = 1.0
    """coefficient of intrinsic reward"""
    ext_coef: float = 2.0
    """coefficient of extrinsic reward"""
    int_gamma: float = 0.99
    """Intrinsic reward discount rate"""
    num_iterations_obs_norm_init: int = 50
    """number of iterations to initialize the observations normalization parameters"""


FAMILY_DEFAULTS = {  # CleanRL's ppo_rnd_envpool.py; classic control: ppo.py's settings with RND's coefficients
    "atari": dict(total_timesteps=2_000_000_000, learning_rate=1e-4, num_envs=128, num_steps=128, gamma=0.999, num_minibatches=4,
                  clip_coef=0.1, ent_coef=0.001, frame_stack=4, normalize=False),
    "classic": dict(total_timesteps=500_000, learning_rate=2.5e-4, num_envs=4, num_steps=128, gamma=0.99, num_minibatches=4,
                    clip_coef=0.2, ent_coef=0.01, normalize=False),
}
AGENT_ROWS = False  # PettingZoo games refused: the predictor, its statistics and the intrinsic returns would learn blank rows

RANGES = {
    **ppo.RANGES,
    "update_proportion": config.fraction("the share of each minibatch the predictor trains on"),
    "int_coef": config.non_negative("the weight of the intrinsic advantage", config.COEF_MAX),
    "ext_coef": config.non_negative("the weight of the extrinsic advantage", config.COEF_MAX),
    "int_gamma": config.fraction("the intrinsic discount factor"),
    "num_iterations_obs_norm_init": config.count("rollouts of random actions that start the observation statistics", low=0),
}


def validate(args: Args, world_size: int = 1) -> None:
    """PPO's checks (with RND's ranges), then curiosity's, before anything starts."""
    ppo.validate(args, world_size, RANGES)
    if args.async_batch is not None and args.async_batch != args.num_envs:
        raise FleetError(f"PPO-RND's intrinsic return runs along each env's steps, and --async-batch {args.async_batch} makes each step's "
                         f"row hold whichever envs were ready first. Leave --async-batch out (two env groups take turns) or set it "
                         f"to --num-envs {args.num_envs}.")
    if args.policy_lag:
        raise FleetError("PPO-RND's curiosity needs the predictor and the observation statistics that acted, and --policy-lag 1 "
                         "trains them while the next rollout is collected. Leave --policy-lag at 0 for ppo_rnd.")
    if args.normalize:
        raise FleetError("PPO-RND normalises its own way (the predictor's inputs, and the intrinsic rewards by their discounted "
                         "return's spread); leave out --normalize for ppo_rnd.")


# ============================================================================ networks
class Agent(ppo.Agent):
    """CleanRL's RND agent: the Nature CNN to 256, then 448 features (vectors: an MLP 64-64); a 2-layer policy head; an
    extra layer whose output, added to the features, feeds the extrinsic and intrinsic value heads. The RND target
    (fixed) and predictor are submodules, so the optimiser, gradient clipping and checkpoints hold them with the rest.
    PPO's acting and evaluation (ppo.Agent) read the policy and the extrinsic value."""

    def __init__(self, obs_shape: tuple[int, ...], action_space: gym.Space, impala: bool = False):
        nn.Module.__init__(self)  # PPO's layers are not made: these are RND's
        self.continuous = False
        if len(obs_shape) == 3:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)), nn.ReLU(), layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
                layer_init(nn.Linear(64 * 7 * 7, 256)), nn.ReLU(), layer_init(nn.Linear(256, 448)), nn.ReLU())
            width, self.scale = 448, 255.0
        else:
            width, self.scale = 64, 1.0
            self.network = nn.Sequential(layer_init(nn.Linear(int(np.prod(obs_shape)), width)), nn.Tanh(),
                                         layer_init(nn.Linear(width, width)), nn.Tanh())
        self.extra_layer = nn.Sequential(layer_init(nn.Linear(width, width), std=0.1), nn.ReLU())
        self.actor = nn.Sequential(layer_init(nn.Linear(width, width), std=0.01), nn.ReLU(),
                                   layer_init(nn.Linear(width, int(action_space.n)), std=0.01))
        self.critic_ext = layer_init(nn.Linear(width, 1), std=0.01)
        self.critic_int = layer_init(nn.Linear(width, 1), std=0.01)
        self.rnd = RNDModel(obs_shape)
        self.compute_dtype = torch.float32  # set by the engine's precision choice (fleetrl/accel.py)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and extrinsic value, in fp32 (what acting and PPO's loss read)."""
        logits, value_ext, _ = self.get_action_logits_and_values(x)
        return logits, value_ext

    def get_action_logits_and_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with autocast(x.device.type, self.compute_dtype):  # --precision: only the network runs in bf16
            hidden = self.network(x.float() / self.scale)
            features = self.extra_layer(hidden)
            logits = self.actor(hidden)
            value_ext, value_int = self.critic_ext(features + hidden), self.critic_int(features + hidden)
        return logits.float(), value_ext.float().squeeze(-1), value_int.float().squeeze(-1)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:  # the extrinsic value: the sampler's bootstrap at time limits
        return self.get_action_logits_and_values(x)[1]

    def get_value_int(self, x: torch.Tensor) -> torch.Tensor:
        return self.get_action_logits_and_values(x)[2]


class RNDModel(nn.Module):
    """The fixed random target and the predictor that learns it, on the newest frame (vectors: the observation),
    normalised by running statistics and clipped to [-5, 5]."""

    def __init__(self, obs_shape: tuple[int, ...]):
        super().__init__()
        if len(obs_shape) == 3:
            feature_output, output_size = 7 * 7 * 64, 512

            def encoder() -> list[nn.Module]:
                return [layer_init(nn.Conv2d(in_channels=1, out_channels=32, kernel_size=8, stride=4)), nn.LeakyReLU(),
                        layer_init(nn.Conv2d(in_channels=32, out_channels=64, kernel_size=4, stride=2)), nn.LeakyReLU(),
                        layer_init(nn.Conv2d(in_channels=64, out_channels=64, kernel_size=3, stride=1)), nn.LeakyReLU(),
                        nn.Flatten()]
        else:
            feature_output, output_size = 64, 64

            def encoder() -> list[nn.Module]:
                return [layer_init(nn.Linear(int(np.prod(obs_shape)), 64)), nn.LeakyReLU(), layer_init(nn.Linear(64, 64)), nn.LeakyReLU()]

        # Prediction network
        self.predictor = nn.Sequential(*encoder(), layer_init(nn.Linear(feature_output, output_size)), nn.ReLU(),
                                       layer_init(nn.Linear(output_size, output_size)), nn.ReLU(),
                                       layer_init(nn.Linear(output_size, output_size)))
        # Target network
        self.target = nn.Sequential(*encoder(), layer_init(nn.Linear(feature_output, output_size)))
        self.target.requires_grad_(False)  # target network is not trainable

    def forward(self, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.predictor(next_obs), self.target(next_obs)


def rnd_input(obs: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """What the RND networks see of an observation: the newest of the stacked frames (as ``(1, 84, 84)``), or the vector."""
    return obs[..., -1:, :, :] if obs.ndim >= 4 else obs


# ============================================================================ curiosity
class Curiosity:
    """PPO-RND's additions to PPO's iteration: the observation statistics (started by --num-iterations-obs-norm-init
    rollouts of random actions), the intrinsic rewards, the two advantages, and the loss with the intrinsic value and
    the predictor's terms. Its statistics are checkpointed with the run."""

    CHUNK = 4096  # observations a batched pass takes at once (bounds the memory of a 128 x 128 Atari rollout)

    def __init__(self, run, agent: Agent, sampler):
        self.args, self.dist, self.device, self.agent = run.args, run.dist, run.device, agent
        envs = sampler.envs
        obs_space = envs.single_observation_space
        self.obs_rms = RunningMeanStd(shape=rnd_input(np.zeros((1, *obs_space.shape))).shape[1:])
        self.reward_rms = RunningMeanStd()
        self.discounted_reward = DiscountedSum(self.args.int_gamma, run.local_num_envs)  # CleanRL's RewardForwardFilter
        self.charts: dict[str, float] = {}
        run.register(rnd_obs_rms=self.obs_rms, rnd_reward_rms=self.reward_rms)
        run.register_per_rank(rnd_reward_filter=self.discounted_reward)
        if run.resumed is None and self.args.num_iterations_obs_norm_init:  # CleanRL's start; a resumed run has its statistics
            if self.dist.is_main:
                print(f"curiosity: starting the observation statistics with {self.args.num_iterations_obs_norm_init} rollouts of random "
                      f"actions", flush=True)
            sampler.begin(stats_from_random_actions(envs, self.obs_rms, self.args.num_iterations_obs_norm_init, self.args.num_steps,
                                                    rnd_input, run.seed, run.env_seed, self.dist.allreduce_sum_np))  # no second reset

    def _set_obs_stats(self) -> None:
        self.obs_mean = torch.as_tensor(self.obs_rms.mean, device=self.device)  # float64, as CleanRL normalises
        self.obs_std = torch.as_tensor(self.obs_rms.var, device=self.device).sqrt()

    def normalized(self, obs: torch.Tensor) -> torch.Tensor:
        """The predictor's and target's input: the newest frame normalised (in float64), clipped, as float32."""
        return ((rnd_input(obs).double() - self.obs_mean) / self.obs_std).clip(-5, 5).float()

    # ------------------------------------------------------------------------ advantage
    @torch.no_grad()
    def advantage(self, b) -> dict[str, np.ndarray]:
        """The intrinsic rewards of the rollout's steps, scaled; the extrinsic (episodic, PPO's GAE) and intrinsic
        (never ending) advantages, mixed into ``b.advantages``; ``b.returns`` the extrinsic returns. Returns the
        intrinsic returns for the loss. Then the observation statistics take in the rollout."""
        args, agent = self.args, self.agent
        num_steps, num_envs = b.rewards.shape
        agent.eval()
        self._set_obs_stats()  # as the statistics stand (a resumed run's were loaded after this object was made)
        next_obs = b.next_obs(rnd_input).reshape(num_steps * num_envs, *self.obs_rms.mean.shape)
        obs = b.obs.reshape(num_steps * num_envs, *b.obs.shape[2:])
        curiosity_rewards, int_values = np.zeros(num_steps * num_envs, np.float32), np.zeros(num_steps * num_envs, np.float32)
        for start in range(0, len(obs), self.CHUNK):
            chunk = slice(start, start + self.CHUNK)
            predict_next_feature, target_next_feature = agent.rnd(self.normalized(torch.as_tensor(next_obs[chunk], device=self.device)))
            curiosity_rewards[chunk] = ((target_next_feature - predict_next_feature).pow(2).sum(1) / 2).cpu().numpy()
            int_values[chunk] = agent.get_value_int(torch.as_tensor(obs[chunk], device=self.device)).cpu().numpy()
        curiosity_rewards, int_values = curiosity_rewards.reshape(num_steps, num_envs), int_values.reshape(num_steps, num_envs)
        next_value_int = agent.get_value_int(torch.as_tensor(b.last_obs, device=self.device)).cpu().numpy()
        self.int_values, self.next_value_int = int_values, next_value_int  # kept for a look (benchmarks/vs_cleanrl.py ppo_rnd)

        curiosity_reward_per_env = np.stack([self.discounted_reward.update(reward_per_step) for reward_per_step in curiosity_rewards])
        self.reward_rms.update(curiosity_reward_per_env, self.dist.allreduce_sum_np)
        self.charts = {"curiosity_reward": float(curiosity_rewards.mean())}  # before scaling, as CleanRL logs it
        curiosity_rewards /= np.sqrt(self.reward_rms.var)

        ext_advantages = ppo.gae(b, args.gamma, args.gae_lambda)
        int_advantages = np.zeros_like(curiosity_rewards)
        int_lastgaelam = 0.0
        for t in reversed(range(num_steps)):  # the intrinsic return does not stop where an episode ends
            int_nextvalues = next_value_int if t == num_steps - 1 else int_values[t + 1]
            int_delta = curiosity_rewards[t] + args.int_gamma * int_nextvalues - int_values[t]
            int_advantages[t] = int_lastgaelam = int_delta + args.int_gamma * args.gae_lambda * int_lastgaelam
        b.returns[:] = ext_advantages + b.values
        b.advantages[:] = int_advantages * args.int_coef + ext_advantages * args.ext_coef

        self.obs_rms.update(rnd_input(obs), self.dist.allreduce_sum_np)  # the predictor trains on the updated statistics
        self._set_obs_stats()
        # the predictor's inputs, normalised once, and the fixed target's features of them, computed once (CleanRL runs
        # the target again every epoch); in minibatch-sized chunks, so the kernels see the shapes CleanRL's loss gives them
        chunks = [slice(start, start + len(obs) // args.num_minibatches) for start in range(0, len(obs), len(obs) // args.num_minibatches)]
        rnd_obs = torch.cat([self.normalized(torch.as_tensor(obs[chunk], device=self.device)) for chunk in chunks])
        rnd_target = torch.cat([agent.rnd.target(rnd_obs[chunk]) for chunk in chunks])
        return {"int_returns": torch.from_numpy((int_advantages + int_values).reshape(-1)), "rnd_obs": rnd_obs, "rnd_target": rnd_target}

    # ------------------------------------------------------------------------ loss
    def loss(self, agent: Agent, mb: dict[str, torch.Tensor], args: Args, dist) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """PPO's loss on the extrinsic value, plus the intrinsic value's (unclipped) and the predictor's, which learns
        on a random --update-proportion of the minibatch (towards the target's features, computed with the advantages).
        CleanRL runs the predictor on the whole minibatch and zeroes the rest's loss; only the chosen rows run here."""
        mask = torch.rand(len(mb["rnd_obs"]), device=mb["rnd_obs"].device)
        mask = (mask < args.update_proportion).float()
        rows = mask.nonzero().squeeze(1) if mask.any() else mask.new_zeros(1, dtype=torch.long)  # none: one row, weighted 0
        predict_next_state_feature, target_next_state_feature = agent.rnd.predictor(mb["rnd_obs"][rows]), mb["rnd_target"][rows]
        forward_loss = nn.functional.mse_loss(predict_next_state_feature, target_next_state_feature.detach(), reduction="none").mean(-1)
        forward_loss = (forward_loss * mask[rows]).sum() / mask.sum().clamp(min=1.0)  # CleanRL's max(mask.sum(), [1]), as a scalar

        logits, new_ext_values, new_int_values = agent.get_action_logits_and_values(mb["obs"])
        newlogprob, entropy = categorical_logprob_entropy(logits, mb["actions"])
        logratio = newlogprob - mb["logprobs"]
        ratio = logratio.exp()
        with torch.no_grad():
            old_approx_kl = (-logratio).mean()
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
        mb_advantages = dist.normalize(mb["advantages"]) if args.norm_adv else mb["advantages"]

        # Policy loss: PPO's clipped surrogate
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        # Value loss: the extrinsic value's (clipped, as PPO's) and the intrinsic value's, added before --vf-coef
        if args.clip_vloss:
            ext_v_loss_unclipped = (new_ext_values - mb["returns"]) ** 2
            ext_v_clipped = mb["values"] + torch.clamp(new_ext_values - mb["values"], -args.clip_coef, args.clip_coef)
            ext_v_loss = 0.5 * torch.max(ext_v_loss_unclipped, (ext_v_clipped - mb["returns"]) ** 2).mean()
        else:
            ext_v_loss = 0.5 * ((new_ext_values - mb["returns"]) ** 2).mean()
        int_v_loss = 0.5 * ((new_int_values - mb["int_returns"]) ** 2).mean()
        v_loss = ext_v_loss + int_v_loss

        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef + forward_loss
        stats = {"value_loss": v_loss, "policy_loss": pg_loss, "entropy": entropy_loss, "old_approx_kl": old_approx_kl,
                 "approx_kl": approx_kl, "clipfrac": clipfrac, "int_value_loss": int_v_loss, "fwd_loss": forward_loss}
        return loss, {k: v.detach() for k, v in stats.items()}


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """Train PPO-RND, in one process or under torchrun: PPO's iteration (fleetrl/algos/ppo.py: its rollout and update)
    with RND's agent, and its curiosity, which computes the advantages and the loss."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    with Run.start(args, explicit, FAMILY_DEFAULTS, validate, algo="ppo_rnd", lag_worker="sampler thread") as run:
        args, dist, device, family = run.args, run.dist, run.device, run.family
        batch_size = args.num_envs * args.num_steps  # global, over all ranks
        local_minibatch_size = run.local_num_envs * args.num_steps // args.num_minibatches
        num_iterations = args.total_timesteps // batch_size

        async_batch = local_async_batch(args.async_batch, args.num_envs, run.local_num_envs)  # None, or every env (validate)
        envs = run.make_envs(async_batch=async_batch, frame_stack=args.frame_stack)
        obs_shape = envs.single_observation_space.shape
        agent = Agent(obs_shape, envs.single_action_space, impala=family.name == "procgen").to(device)
        dist.broadcast_parameters(agent)  # every replica starts from rank 0's parameters
        accel = run.choose_accel(agent, envs.single_observation_space, local_minibatch_size)
        optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
        grad_sync = dist.gradient_sync(agent.parameters())  # averages gradients over ranks, overlapping backward
        run.register(model=agent, optimizer=optimizer)
        obs_norm, reward_norm = onpolicy.normalizers(run, obs_shape)  # (None, None): --normalize is refused
        log = run.start_logging(envs, num_iterations, batch_size, notes={"precision": f"{accel.label}: {accel.reason}"})
        # keep_next_obs: each step's next observation (an episode's last where it ended) is what the curiosity is of
        sampler = onpolicy.sampler(run, envs, agent, log, ppo.rollout, async_batch, obs_norm, reward_norm, keep_next_obs=True)
        curiosity = Curiosity(run, agent, sampler)  # its statistics, started by random actions (or the resumed run's)
        loss_fn = accel.compiled(curiosity.loss, agent, dist)  # torch.compile with --compile (eager if it fails)
        run.restore()  # a resumed run: its model, optimiser, statistics and RNG streams, exactly as they were

        for iteration in run.iterations():
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            # ---------------------------------------------------------------- rollout
            buffer = sampler.collect()

            # ---------------------------------------------------------------- advantage: extrinsic and intrinsic, mixed
            with log.timer.learn:
                extra = curiosity.advantage(buffer)

            # ---------------------------------------------------------------- update
            with log.timer.learn:
                batch = onpolicy.batch(buffer, device, extra)
                stats = ppo.update(agent, optimizer, grad_sync, batch, loss_fn, args, dist)
            sampler.weights_updated()  # the acting weights follow the learner: a versioned copy, swapped between rollouts

            # ---------------------------------------------------------------- logging
            stats["explained_variance"] = onpolicy.explained_variance(buffer, dist)
            run.end_iteration(iteration, buffer.global_step, buffer.episodes, losses=stats,
                              charts={"learning_rate": optimizer.param_groups[0]["lr"], "policy_lag": sampler.policy_lag, **curiosity.charts})
        return run.finish(agent)


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``obs -> action``: the most probable action, or a sample."""
    agent = Agent(envs.single_observation_space.shape, envs.single_action_space)
    agent.load_state_dict(state["model"])
    return policy_fn(agent, envs, deterministic)


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
