"""PPO with Transformer-XL memory, CleanRL's ppo_trxl.py on fleetrl's engine: PPO's loop and advantage (ppo.py), with a
Transformer-XL agent whose memory is each episode's past hidden states, a rollout that records which episode memory
and which window of it each step attended to, and CleanRL's loss, AdamW and annealed learning rate and entropy bonus.

Order: arguments, the network (positional encoding, attention, layers, agent), the rollout loop, the minibatches, the
loss, training.

As in CleanRL: each env keeps its episode's memory, ``(max_episode_steps, layers, dim)``, the inputs of every layer at
every step so far; a step attends to a window of ``--trxl-memory-length`` of them (``memory_indices``), masked to the
steps before it (``memory_mask``); the update gathers each sample's window from its episode's memory as the rollout
left it, trimmed to the longest window the rollout used.

The recurrent state (fleetrl/policy.py's ``state_shape``) is ``(max_episode_steps + 1, layers, dim)`` per env: the
episode's memory in the first ``max_episode_steps`` rows and the episode's step count in the last row (every entry of
it, as a float: exact below 2**24). It is what the sampler carries between steps and checkpoints (an exact resume), and
what eval carries through an episode; an episode start zeroes it.

Differences from CleanRL, each on purpose (besides PPO's, ppo.py):
* time-limit truncation bootstraps from the value of the final observation (CleanRL treats it as termination); the value
  after the rollout's last step reads the window that step would act with (CleanRL's reads its window one step back,
  and the positional encoding of the previous step);
* actions are sampled by the engine (Gumbel-max over CleanRL's logits with its own numpy RNG), so a rollout does not
  depend on torch's RNG;
* discrete action spaces only (memory-gym's MultiDiscrete tasks are not installable beside gymnasium 1.x: fleetrl/envs/
  memory.py); the serial and split samplers only (no --async-batch, no --policy-lag 1); fp32 only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from fleetrl import config, onpolicy
from fleetrl.algos import ppo
from fleetrl.algos.source import train_main
from fleetrl.args import OnPolicyArgs, validate_onpolicy
from fleetrl.distributed import Dist
from fleetrl.errors import FleetError
from fleetrl.monitor import TrainResult
from fleetrl.policy import policy_fn
from fleetrl.run import Run
from fleetrl.sampling.sampler import Due, local_async_batch

UNBOUNDED_EPISODE_STEPS = 1024  # CleanRL's memory length for an env without a time limit
MINIGRID_TIME_LIMIT = 96  # CleanRL's make_env cuts MiniGrid's episodes there (fleetrl/envs/memory.py does the same)


# ============================================================================ arguments
@dataclass
class Args(OnPolicyArgs):
    """CleanRL's ppo_trxl.py flags and defaults, then the engine's (fleetrl/args.py)."""

    exp_name: str = "ppo_trxl"
    """the name of this experiment"""
    env_id: str = "ProofofMemory-v0"
    """the id of the environment (CleanRL's default, MortarMayhem-Grid-v0, is memory-gym's: not installable here)"""
    total_timesteps: int | None = 200_000_000
    """total timesteps of the experiments"""
    init_lr: float = 2.75e-4
    """the initial learning rate of the optimizer"""
    final_lr: float = 1.0e-5
    """the final learning rate of the optimizer after linearly annealing"""
    num_envs: int | None = 32
    """the number of parallel game environments"""
    num_steps: int = 512
    """the number of steps to run in each environment per policy rollout"""
    anneal_steps: int = 32 * 512 * 10000
    """the number of steps to linearly anneal the learning rate and entropy coefficient from initial to final"""
    gamma: float = 0.995
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches"""
    update_epochs: int = 3
    """the K epochs to update the policy"""
    norm_adv: bool = False
    """Toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    init_ent_coef: float = 0.0001
    """initial coefficient of the entropy bonus"""
    final_ent_coef: float = 0.000001
    """final coefficient of the entropy bonus after linearly annealing"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.25
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold"""

    # Transformer-XL specific arguments
    trxl_num_layers: int = 3
    """the number of transformer layers"""
    trxl_num_heads: int = 4
    """the number of heads used in multi-head attention"""
    trxl_dim: int = 384
    """the dimension of the transformer"""
    trxl_memory_length: int = 119
    """the length of TrXL's sliding memory window (at most the env's episode length)"""
    trxl_positional_encoding: str = "absolute"
    """the positional encoding type of the transformer, choices: "", "absolute", "learned" (any other: none)"""
    reconstruction_coef: float = 0.0
    """the coefficient of the observation reconstruction loss, if set to 0.0 the reconstruction loss is not used"""


FAMILY_DEFAULTS = {"classic": {}}  # CleanRL's defaults are the flags' own; memory tasks are discrete: vectors or images
AGENT_ROWS = False  # PettingZoo games refused: an agent that leaves a game early would cut its episode memory

RANGES = {
    **{name: check for name, check in ppo.RANGES.items() if name not in ("learning_rate", "ent_coef")},  # annealed here
    "init_lr": config.positive("the initial learning rate", config.COEF_MAX),
    "final_lr": config.non_negative("the final learning rate", config.COEF_MAX),
    "anneal_steps": config.count("steps over which the learning rate and entropy coefficient anneal", low=0),
    "init_ent_coef": config.non_negative("the initial weight of the entropy bonus", config.COEF_MAX),
    "final_ent_coef": config.non_negative("the final weight of the entropy bonus", config.COEF_MAX),
    "trxl_num_layers": config.count("transformer layers", high=64),
    "trxl_num_heads": config.count("attention heads", high=256),
    "trxl_dim": config.count("the transformer's width", high=65536),
    "trxl_memory_length": config.count("steps in the memory window", high=1 << 20),
    "reconstruction_coef": config.non_negative("the weight of the observation reconstruction loss", config.COEF_MAX),
}


def validate(args: Args, world_size: int = 1) -> None:
    """Refuse a configuration that cannot run, before anything starts."""
    validate_onpolicy(args, world_size, RANGES)
    local_batch_size = args.num_envs // world_size * args.num_steps
    if local_batch_size % args.num_minibatches:
        raise FleetError(f"The batch of --num-envs {args.num_envs} x --num-steps {args.num_steps} ({local_batch_size} samples a process) "
                         f"does not split into --num-minibatches {args.num_minibatches} whole minibatches. Choose one of "
                         f"{', '.join(map(str, config.divisors(local_batch_size)))}, or change --num-envs/--num-steps.")
    if args.trxl_dim % args.trxl_num_heads:
        raise FleetError(f"--trxl-dim {args.trxl_dim} does not split into --trxl-num-heads {args.trxl_num_heads} equal heads: "
                         f"choose a number of heads that divides it (e.g. {', '.join(map(str, config.divisors(args.trxl_dim)[:6]))}).")
    if args.async_batch is not None and args.async_batch < args.num_envs:
        raise FleetError(f"ppo_trxl records which episode memory each step of each env attended to, and --async-batch "
                         f"{args.async_batch} gives first-ready batches, whose rows are not steps. Leave --async-batch out.")
    if args.policy_lag:
        raise FleetError("ppo_trxl's rollout records each episode's memory for the update that follows it, so it cannot run a "
                         "rollout ahead of the learner: leave --policy-lag out (0).")
    if args.compile or args.precision == "bf16":
        raise FleetError("ppo_trxl runs eagerly in fp32, as CleanRL's does: leave out --compile and --precision bf16.")
    if args.total_timesteps < args.num_envs * args.num_steps:
        raise FleetError(f"--total-timesteps {args.total_timesteps} is less than one batch ({args.num_envs * args.num_steps}); raise it.")


def max_episode_steps(env_id: str) -> int:
    """The longest episode the env allows, as CleanRL reads it: MiniGrid's 96 (CleanRL's wrapping, which fleetrl's
    env layer applies: fleetrl/envs/memory.py), else the id's time limit, else 1024 (memory-gym's envs have none)."""
    name = env_id.rpartition(":")[2]
    limit = MINIGRID_TIME_LIMIT if name.startswith("MiniGrid-") else gym.spec(name).max_episode_steps
    return limit if limit and limit > 0 else UNBOUNDED_EPISODE_STEPS


# ============================================================================ network
def layer_init(layer: nn.Module, std: float = np.sqrt(2)) -> nn.Module:
    """CleanRL's ppo_trxl layer_init: orthogonal weights; the biases keep PyTorch's default (CleanRL's constant_ is off)."""
    torch.nn.init.orthogonal_(layer.weight, std)
    return layer


def batched_index_select(input: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``input[b, index[b, ...]]`` along ``dim`` for every ``b``: each sample's memory window from its memory."""
    for ii in range(1, len(input.shape)):
        if ii != dim:
            index = index.unsqueeze(ii)
    expanse = list(input.shape)
    expanse[0] = -1
    expanse[dim] = -1
    index = index.expand(expanse)
    return torch.gather(input, dim, index)


class PositionalEncoding(nn.Module):
    """Sinusoidal encodings of the positions ``seq_len - 1 .. 0`` (CleanRL's, newest first)."""

    def __init__(self, dim: int, min_timescale: float = 2.0, max_timescale: float = 1e4):
        super().__init__()
        freqs = torch.arange(0, dim, min_timescale)
        inv_freqs = max_timescale ** (-freqs / dim)
        self.register_buffer("inv_freqs", inv_freqs)

    def forward(self, seq_len: int) -> torch.Tensor:
        seq = torch.arange(seq_len - 1, -1, -1.0, device=self.inv_freqs.device)
        sinusoidal_inp = seq[:, None] * self.inv_freqs[None, :]
        return torch.cat((sinusoidal_inp.sin(), sinusoidal_inp.cos()), dim=-1)


class MultiHeadAttention(nn.Module):
    """CleanRL's attention: one projection shared by the heads, scaled by sqrt(embed_dim), masked with -1e20."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_size = embed_dim // num_heads
        self.values = nn.Linear(self.head_size, self.head_size, bias=False)
        self.keys = nn.Linear(self.head_size, self.head_size, bias=False)
        self.queries = nn.Linear(self.head_size, self.head_size, bias=False)
        self.fc_out = nn.Linear(self.num_heads * self.head_size, embed_dim)

    def forward(self, values, keys, query, mask):
        N = query.shape[0]
        value_len, key_len, query_len = values.shape[1], keys.shape[1], query.shape[1]
        values = self.values(values.reshape(N, value_len, self.num_heads, self.head_size))
        keys = self.keys(keys.reshape(N, key_len, self.num_heads, self.head_size))
        queries = self.queries(query.reshape(N, query_len, self.num_heads, self.head_size))
        energy = torch.einsum("nqhd,nkhd->nhqk", [queries, keys])
        if mask is not None:  # the steps a query may not see weigh 0 (-inf would give NaN where it sees none)
            energy = energy.masked_fill(mask.unsqueeze(1).unsqueeze(1) == 0, float("-1e20"))
        attention = torch.softmax(energy / (self.embed_dim ** (1 / 2)), dim=3)
        out = torch.einsum("nhql,nlhd->nqhd", [attention, values]).reshape(N, query_len, self.num_heads * self.head_size)
        return self.fc_out(out), attention


class TransformerLayer(nn.Module):
    """Pre-layer-norm attention over the memory window, then a ReLU projection, each with a skip connection."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.attention = MultiHeadAttention(dim, num_heads)
        self.layer_norm_q = nn.LayerNorm(dim)
        self.norm_kv = nn.LayerNorm(dim)
        self.layer_norm_attn = nn.LayerNorm(dim)
        self.fc_projection = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())

    def forward(self, value, key, query, mask):
        query_ = self.layer_norm_q(query)
        value = self.norm_kv(value)
        key = value  # K = V: self-attention
        attention, attention_weights = self.attention(value, key, query_, mask)
        x = attention + query
        x_ = self.layer_norm_attn(x)
        return self.fc_projection(x_) + x, attention_weights


class Transformer(nn.Module):
    """The layers; each layer's input at this step is what the memory keeps of it (returned, detached)."""

    def __init__(self, num_layers: int, dim: int, num_heads: int, max_episode_steps: int, positional_encoding: str):
        super().__init__()
        self.max_episode_steps = max_episode_steps
        self.positional_encoding = positional_encoding
        if positional_encoding == "absolute":
            self.pos_embedding = PositionalEncoding(dim)
        elif positional_encoding == "learned":
            self.pos_embedding = nn.Parameter(torch.randn(max_episode_steps, dim))
        self.transformer_layers = nn.ModuleList([TransformerLayer(dim, num_heads) for _ in range(num_layers)])

    def forward(self, x, memories, mask, memory_indices):
        if self.positional_encoding == "absolute":  # added to every layer's memory
            memories = memories + self.pos_embedding(self.max_episode_steps)[memory_indices].unsqueeze(2)
        elif self.positional_encoding == "learned":
            memories = memories + self.pos_embedding[memory_indices].unsqueeze(2)
        out_memories = []
        for i, layer in enumerate(self.transformer_layers):
            out_memories.append(x.detach())
            x, _ = layer(memories[:, :, i], memories[:, :, i], x.unsqueeze(1), mask)  # value, key, query, mask
            x = x.squeeze(1)
        return x, torch.stack(out_memories, dim=1)


class Agent(nn.Module):
    """CleanRL's ppo_trxl Agent (its module names, so its state_dict loads here): an encoder (a Nature CNN on HWC
    images, a linear layer on vectors), the Transformer-XL, a ReLU layer, the policy and value heads."""

    continuous = False

    def __init__(self, obs_shape: tuple[int, ...], action_space: gym.Space, max_episode_steps: int, trxl_num_layers: int,
                 trxl_num_heads: int, trxl_dim: int, trxl_memory_length: int, trxl_positional_encoding: str,
                 reconstruction: bool = False):
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise FleetError(f"ppo_trxl acts in Discrete action spaces (CleanRL's memory tasks), not {action_space}.")
        self.obs_shape, self.max_episode_steps = tuple(obs_shape), max_episode_steps
        self.memory_length = min(trxl_memory_length, max_episode_steps)  # CleanRL's: at most an episode
        self.state_shape = (max_episode_steps + 1, trxl_num_layers, trxl_dim)  # the memory, then the step count
        if len(self.obs_shape) > 1:
            self.encoder = nn.Sequential(
                layer_init(nn.Conv2d(3, 32, 8, stride=4)), nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
                nn.Flatten(), layer_init(nn.Linear(64 * 7 * 7, trxl_dim)), nn.ReLU(),
            )
        else:
            self.encoder = layer_init(nn.Linear(self.obs_shape[0], trxl_dim))
        self.transformer = Transformer(trxl_num_layers, trxl_dim, trxl_num_heads, max_episode_steps, trxl_positional_encoding)
        self.hidden_post_trxl = nn.Sequential(layer_init(nn.Linear(trxl_dim, trxl_dim)), nn.ReLU())
        self.actor_branches = nn.ModuleList([layer_init(nn.Linear(trxl_dim, int(action_space.n)), np.sqrt(0.01))])
        self.critic = layer_init(nn.Linear(trxl_dim, 1), 1)
        if reconstruction:
            self.transposed_cnn = nn.Sequential(
                layer_init(nn.Linear(trxl_dim, 64 * 7 * 7)), nn.ReLU(), nn.Unflatten(1, (64, 7, 7)),
                layer_init(nn.ConvTranspose2d(64, 64, 3, stride=1)), nn.ReLU(),
                layer_init(nn.ConvTranspose2d(64, 32, 4, stride=2)), nn.ReLU(),
                layer_init(nn.ConvTranspose2d(32, 3, 8, stride=4)), nn.Sigmoid(),
            )
        L = self.memory_length
        # which steps of the episode a step's window holds: 0..L-1 for the first L steps, then the L up to this one
        windows = torch.stack([torch.arange(i, i + L) for i in range(max_episode_steps - L + 1)])
        self.register_buffer("memory_indices", torch.cat((torch.arange(L).repeat(L - 1, 1), windows)).long(), persistent=False)
        # the positions of the window a step attends to: those before its own
        self.register_buffer("memory_mask", torch.tril(torch.ones((L, L)), diagonal=-1), persistent=False)

    @property
    def actor(self) -> nn.Module:  # the engine's actors read the number of actions from it
        return self.actor_branches[0]

    def hidden(self, x, memory_window, memory_mask, memory_indices):
        """The encoder, the transformer over the memory window and the ReLU layer; and the layers' inputs to memorise."""
        x = self.encoder(x.permute((0, 3, 1, 2)) / 255.0) if len(self.obs_shape) > 1 else self.encoder(x)
        x, memory = self.transformer(x, memory_window, memory_mask, memory_indices)
        self.x = self.hidden_post_trxl(x)  # what the reconstruction decodes
        return self.x, memory

    def window(self, episode_step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The window indices and mask of the steps at ``episode_step`` (clamped: an episode longer than the env's time
        limit, or the value of a truncated episode's final observation, reads the last window)."""
        step = episode_step.clamp(max=self.max_episode_steps - 1)
        return self.memory_indices[step], self.memory_mask[step.clamp(max=self.memory_length - 1)]

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, starts: torch.Tensor | None = None):
        """One step of ``N`` envs from their states (zeroed where ``starts``): logits, values and the states after."""
        n = x.shape[0]  # not len(): a traced graph (fleetrl export) keeps its batch free
        state = torch.zeros(n, *self.state_shape, device=x.device) if state is None else state
        if starts is not None:
            state = torch.where(starts.reshape(-1, 1, 1, 1), torch.zeros((), device=x.device), state)
        memory, episode_step = state[:, :-1], state[:, -1, 0, 0].long()
        indices, mask = self.window(episode_step)
        hidden, new_memory = self.hidden(x, batched_index_select(memory, 1, indices), mask, indices)
        after = state.clone()
        after[torch.arange(n, device=x.device), episode_step.clamp(max=self.max_episode_steps - 1)] = new_memory
        step_row = (episode_step + 1).to(state.dtype).reshape(-1, 1, 1, 1).expand(-1, 1, *state.shape[2:])
        after = torch.cat((after[:, :-1], step_row), dim=1)  # not an assignment: a traced graph (export) keeps its batch free
        return self.actor(hidden), self.critic(hidden).flatten(), after

    def evaluate(self, mb: dict[str, torch.Tensor]):
        """Update: CleanRL's ``get_action_and_value`` on a minibatch's windows: log-probabilities ``(B, 1)``,
        entropies and values."""
        hidden, _ = self.hidden(mb["obs"], mb["memory_windows"], mb["memory_mask"], mb["memory_indices"])
        probs = [Categorical(logits=branch(hidden)) for branch in self.actor_branches]
        action = mb["actions"].reshape(len(hidden), -1)
        log_probs = torch.stack([dist.log_prob(action[:, i]) for i, dist in enumerate(probs)], dim=1)
        entropies = torch.stack([dist.entropy() for dist in probs], dim=1).sum(1).reshape(-1)
        return log_probs, entropies, self.critic(hidden).flatten()

    def reconstruct_observation(self) -> torch.Tensor:
        return self.transposed_cnn(self.x).permute((0, 2, 3, 1))

    def act(self, x: torch.Tensor, deterministic: bool, state: torch.Tensor, starts: torch.Tensor):
        """The policy interface (fleetrl/policy.py), for evaluation: actions and the states after the step."""
        logits, _, state = self(x, state, starts)
        return (logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()), state


def episode_steps(state: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each env's step in its episode, as the agent reads it from the state (0 where an episode starts)."""
    return np.where(starts, 0, state[:, -1, 0, 0]).astype(np.int64)


# ============================================================================ rollout
class Rollout:
    """PPO's rollout loop (ppo.py), carrying each env's episode memory in its state, and recording, as CleanRL's
    ``stored_memories``, ``stored_memory_index`` and the steps' windows do, which episode memory each transition read
    (``memory_index``, ``(num_steps, num_envs)``) and at which episode step (``episode_step``); ``memories``: each episode's
    memory as the rollout left it, the ones in flight at its start first (a step reads only the steps before it, which
    later steps leave as they were)."""

    def __init__(self, num_steps: int, num_envs: int):
        self.memory_index = np.zeros((num_steps, num_envs), np.int64)
        self.episode_step = np.zeros((num_steps, num_envs), np.int64)
        self.memories: list[np.ndarray] = []

    def __call__(self, steps: Iterable[Due]) -> None:
        t = np.zeros(len(self.memory_index[0]), np.int64)  # per env: its next row
        episode = np.zeros_like(t)  # per env: the index of its current episode's memory
        latest: dict[int, np.ndarray] = {}  # per env: its current episode's memory after its latest step (a view)
        self.memories = []
        for due in steps:  # envs whose next action is due, with their observations and states
            action, logprob, value, state = due.actor.act(due.obs, due.noise, due.state, due.starts)
            due.store(obs=due.obs, actions=action, logprobs=logprob, values=value, starts=due.starts)
            due.keep_state(state)  # the state after this step, for these envs' next one
            for k, env in enumerate(due.env_ids):
                if t[env] == 0 or due.starts[k]:  # an episode in flight at the rollout's start, or a new one
                    if env in latest:
                        self.memories[episode[env]] = latest[env].copy()  # the episode that ended
                    episode[env] = len(self.memories)
                    self.memories.append(None)
                self.memory_index[t[env], env] = episode[env]
                latest[env] = state[k, :-1]
            self.episode_step[t[due.env_ids], due.env_ids] = episode_steps(due.state, due.starts)
            t[due.env_ids] += 1
            due.send(action)
        for env, memory in latest.items():
            self.memories[episode[env]] = memory.copy()

    def batch(self, agent: Agent, device: torch.device) -> dict[str, torch.Tensor]:
        """What the update reads besides the rollout's rows: each row's episode and window, and the episode memories,
        trimmed to the longest window used (CleanRL's "remove unnecessary padding")."""
        steps = torch.from_numpy(self.episode_step.reshape(-1)).to(device)
        indices, mask = agent.window(steps)
        memories = torch.from_numpy(np.stack(self.memories)).to(device)
        used = int((indices * mask).max().item()) + 1
        if used < agent.memory_length:
            indices, mask, memories = indices[:, :used], mask[:, :used], memories[:, :used]
        return {"memory_index": torch.from_numpy(self.memory_index.reshape(-1)).to(device), "memory_indices": indices,
                "memory_mask": mask, "memories": memories}


# ============================================================================ update
def minibatches(batch: dict[str, torch.Tensor], num_steps: int, num_minibatches: int) -> Iterator[dict[str, torch.Tensor]]:
    """PPO's shuffled minibatches (ppo.py), each with its samples' memory windows gathered from their episodes."""
    memories = batch["memories"]
    for mb in ppo.minibatches({k: v for k, v in batch.items() if k != "memories"}, num_steps, num_minibatches):
        mb["memory_windows"] = batched_index_select(memories[mb["memory_index"]], 1, mb["memory_indices"])
        yield mb


# ============================================================================ loss
def ppo_trxl_loss(agent: Agent, mb: dict[str, torch.Tensor], args: Args, dist: Dist, ent_coef: float):
    """CleanRL's ppo_trxl loss: the clipped surrogate (per action branch), the clipped value loss (no 0.5 factor), the
    annealed entropy bonus ``ent_coef``, and the observation reconstruction with --reconstruction-coef."""
    newlogprob, entropy, newvalue = agent.evaluate(mb)
    mb_advantages = mb["advantages"]
    if args.norm_adv:
        mb_advantages = dist.normalize(mb_advantages)
    mb_advantages = mb_advantages.unsqueeze(1).repeat(1, newlogprob.shape[1])  # one column per action branch
    logratio = newlogprob - mb["logprobs"].reshape(newlogprob.shape)
    ratio = torch.exp(logratio)
    pgloss1 = -mb_advantages * ratio
    pgloss2 = -mb_advantages * torch.clamp(ratio, 1.0 - args.clip_coef, 1.0 + args.clip_coef)
    pg_loss = torch.max(pgloss1, pgloss2).mean()

    # Value loss
    v_loss_unclipped = (newvalue - mb["returns"]) ** 2
    if args.clip_vloss:
        v_loss_clipped = mb["values"] + (newvalue - mb["values"]).clamp(min=-args.clip_coef, max=args.clip_coef)
        v_loss = torch.max(v_loss_unclipped, (v_loss_clipped - mb["returns"]) ** 2).mean()
    else:
        v_loss = v_loss_unclipped.mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - ent_coef * entropy_loss + v_loss * args.vf_coef
    r_loss = torch.zeros(())
    if args.reconstruction_coef > 0.0:
        r_loss = nn.functional.binary_cross_entropy(agent.reconstruct_observation(), mb["obs"].float() / 255.0)
        loss += args.reconstruction_coef * r_loss
    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    stats = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_loss, "reconstruction_loss": r_loss,
             "old_approx_kl": old_approx_kl, "approx_kl": approx_kl, "clipfrac": clipfrac}
    return loss, {k: v.detach() for k, v in stats.items()}


def annealed(global_step: int, args: Args) -> tuple[float, float]:
    """CleanRL's learning rate and entropy coefficient: linear from their initial to their final values over
    --anneal-steps, then final."""
    do_anneal = args.anneal_steps > 0 and global_step < args.anneal_steps
    frac = 1 - global_step / args.anneal_steps if do_anneal else 0
    return (args.init_lr - args.final_lr) * frac + args.final_lr, (args.init_ent_coef - args.final_ent_coef) * frac + args.final_ent_coef


# ============================================================================ training
def make_agent(args: Args, obs_space: gym.Space, action_space: gym.Space, max_steps: int) -> Agent:
    return Agent(obs_space.shape, action_space, max_steps, args.trxl_num_layers, args.trxl_num_heads, args.trxl_dim,
                 args.trxl_memory_length, args.trxl_positional_encoding, reconstruction=args.reconstruction_coef > 0.0)


def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """Train PPO-TrXL, in one process or under torchrun."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    with Run.start(args, explicit, FAMILY_DEFAULTS, validate, algo="ppo_trxl") as run:
        args, dist, device = run.args, run.dist, run.device
        batch_size = args.num_envs * args.num_steps
        num_iterations = args.total_timesteps // batch_size

        envs = run.make_envs(async_batch=local_async_batch(args.async_batch, args.num_envs, run.local_num_envs))
        obs_space = envs.single_observation_space
        if args.reconstruction_coef > 0.0 and len(obs_space.shape) != 3:
            raise FleetError(f"--reconstruction-coef decodes image observations, and {args.env_id} gives {obs_space}: leave it at 0.")
        max_steps = max_episode_steps(args.env_id)
        run.remember(max_episode_steps=max_steps)  # eval rebuilds the memory from it
        agent = make_agent(args, obs_space, envs.single_action_space, max_steps).to(device)
        dist.broadcast_parameters(agent)
        optimizer = torch.optim.AdamW(agent.parameters(), lr=args.init_lr)  # CleanRL's (weight decay 0.01)
        grad_sync = dist.gradient_sync(agent.parameters())
        run.register(model=agent, optimizer=optimizer)
        log = run.start_logging(envs, num_iterations, batch_size)
        rollout = Rollout(args.num_steps, run.local_num_envs)
        sampler = onpolicy.sampler(run, envs, agent, log, rollout, None, None, None)
        run.restore()

        for iteration in run.iterations():
            # Annealing the learning rate and entropy coefficient
            lr, ent_coef = annealed((iteration - 1) * batch_size, args)  # at the global step before this rollout
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr

            # ---------------------------------------------------------------- rollout
            buffer = sampler.collect()  # Rollout.__call__ above: num_steps x num_envs transitions and their memories

            # ---------------------------------------------------------------- advantage
            with log.timer.learn:
                buffer.advantages[:] = ppo.gae(buffer, args.gamma, args.gae_lambda)
                buffer.returns[:] = buffer.advantages + buffer.values

            # ---------------------------------------------------------------- update
            with log.timer.learn:
                # the rows (less the per-step states the buffer has room for: the memories replace them) and the memories
                batch = {k: v.to(device) for k, v in buffer.flat().items() if k != "states"} | rollout.batch(agent, device)
                stats = ppo.update(agent, optimizer, grad_sync, batch, partial(ppo_trxl_loss, ent_coef=ent_coef), args, dist, minibatches)
            sampler.weights_updated()

            # ---------------------------------------------------------------- logging
            stats["explained_variance"] = onpolicy.explained_variance(buffer, dist)
            run.end_iteration(iteration, buffer.global_step, buffer.episodes, losses=stats,
                              charts={"learning_rate": lr, "entropy_coefficient": ent_coef, "value_mean": float(buffer.values.mean()),
                                      "advantage_mean": float(buffer.advantages.mean())})
        return run.finish(agent)


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``(obs, starts) -> action``, carrying each env's episode memory through its episodes."""
    saved = state["args"]
    max_steps = state.get("remembered", {}).get("max_episode_steps") or max_episode_steps(saved["env_id"])
    args = Args(**{k: v for k, v in saved.items() if k in Args.__dataclass_fields__})
    agent = make_agent(args, envs.single_observation_space, envs.single_action_space, max_steps)
    agent.load_state_dict(state["model"])
    return policy_fn(agent, envs, deterministic)


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
