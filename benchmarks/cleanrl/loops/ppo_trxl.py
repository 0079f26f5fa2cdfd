"""CleanRL's ppo_trxl.py network, memory bookkeeping and update code (benchmarks/cleanrl/ppo_trxl.py), replayed in this
process on fleetrl's recorded rollouts; the changes are listed in benchmarks/cleanrl/README.md.

fleetrl samples its actions from its own numpy RNG (and ProofofMemory-v0 draws from the env's RNG, not numpy's global
one), so CleanRL's acting lines are run on fleetrl's observations, actions and episode ends rather than on their own
draws: its memory bookkeeping must then give fleetrl's memories, windows and values, and its update, from the same
weights, optimiser state and torch RNG state, fleetrl's weights.
"""

from __future__ import annotations

import ast
import copy
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

CLEANRL_FILE = Path(__file__).resolve().parent.parent / "ppo_trxl.py"
POM_FILE = CLEANRL_FILE.with_name("pom_env.py")
DEFINITIONS = ("layer_init", "batched_index_select", "PositionalEncoding", "MultiHeadAttention", "TransformerLayer", "Transformer", "Agent")


def definitions(file: Path, names: tuple[str, ...], namespace: dict[str, Any]) -> SimpleNamespace:
    """The module-level functions and classes ``names`` of a CleanRL file, run in ``namespace`` (its imports), without
    importing the file: ppo_trxl.py imports memory_gym, minigrid and pygame at the top, and pom_env.py registers
    ProofofMemory-v0 over fleetrl's."""
    tree = ast.parse(file.read_text())
    tree.body = [node for node in tree.body if getattr(node, "name", None) in names]
    exec(compile(tree, str(file), "exec"), namespace)
    return SimpleNamespace(**{name: namespace[name] for name in names})


def cleanrl() -> SimpleNamespace:
    """CleanRL's network code. einops, where it is not installed, is its two rearranges: ``"n -> n ()"`` and
    ``"d -> () d"`` (a new axis, the same values)."""
    import torch.nn as nn
    from torch.distributions import Categorical

    try:
        from einops import rearrange
    except ImportError:
        def rearrange(t: torch.Tensor, pattern: str) -> torch.Tensor:
            return {"n -> n ()": lambda: t[:, None], "d -> () d": lambda: t[None, :]}[pattern]()

    return definitions(CLEANRL_FILE, DEFINITIONS, {"torch": torch, "nn": nn, "np": np, "Categorical": Categorical, "rearrange": rearrange})


def cleanrl_pom_env() -> type:
    """CleanRL's PoMEnv class (pom_env.py), unregistered."""
    import gymnasium as gym

    return definitions(POM_FILE, ("PoMEnv",), {"gym": gym, "np": np, "spaces": gym.spaces}).PoMEnv


@dataclass
class Update:
    """One iteration's update as fleetrl ran it: its batch, and the learner before and after."""

    batch: dict[str, torch.Tensor]
    weights_before: dict[str, torch.Tensor]
    optimizer_before: dict[str, Any]
    rng_before: torch.Tensor
    lr: float
    ent_coef: float
    weights_after: dict[str, torch.Tensor] = field(default_factory=dict)


@contextmanager
def recorded(updates: list[Update]):
    """fleetrl's ppo.update (which ppo_trxl calls) recording each call in ``updates``; restored however the run ends."""
    from fleetrl.algos import ppo

    real = ppo.update

    def recording(agent, optimizer, grad_sync, batch, loss_fn, args, dist, minibatches):
        update = Update({k: v.clone() for k, v in batch.items()}, copy.deepcopy(agent.state_dict()), copy.deepcopy(optimizer.state_dict()),
                        torch.get_rng_state(), optimizer.param_groups[0]["lr"], loss_fn.keywords["ent_coef"])
        stats = real(agent, optimizer, grad_sync, batch, loss_fn, args, dist, minibatches)
        update.weights_after = copy.deepcopy(agent.state_dict())
        updates.append(update)
        return stats

    ppo.update = recording
    try:
        yield updates
    finally:
        ppo.update = real


def replay_acting(ns: SimpleNamespace, args: Any, observation_space, action_space_shape, max_episode_steps: int,
                  updates: list[Update]) -> list[dict[str, Any]]:
    """CleanRL's acting lines, iteration by iteration, on fleetrl's observations, actions and episode ends (each
    step's ``next_done`` is the next row's ``starts``), with the weights that acted (those before each update). Returns
    per iteration what its storage held: values, log-probabilities, the memory index, windows and masks, the memories."""
    num_envs, num_steps = args.num_envs, args.num_steps
    agent = ns.Agent(args, observation_space, action_space_shape, max_episode_steps)
    env_ids = range(num_envs)
    env_current_episode_step = torch.zeros((num_envs,), dtype=torch.long)
    next_memory = torch.zeros((num_envs, max_episode_steps, args.trxl_num_layers, args.trxl_dim), dtype=torch.float32)
    memory_mask = torch.tril(torch.ones((args.trxl_memory_length, args.trxl_memory_length)), diagonal=-1)
    repetitions = torch.repeat_interleave(torch.arange(0, args.trxl_memory_length).unsqueeze(0), args.trxl_memory_length - 1, dim=0).long()
    memory_indices = torch.stack(
        [torch.arange(i, i + args.trxl_memory_length) for i in range(max_episode_steps - args.trxl_memory_length + 1)]
    ).long()
    memory_indices = torch.cat((repetitions, memory_indices))
    out = []
    for k, update in enumerate(updates):
        agent.load_state_dict(update.weights_before)
        obs = update.batch["obs"].reshape(num_steps, num_envs, *update.batch["obs"].shape[1:]).float()
        actions = update.batch["actions"].reshape(num_steps, num_envs, 1).long()
        starts = update.batch["starts"].reshape(num_steps, num_envs)
        following = updates[k + 1].batch["starts"][:num_envs] if k + 1 < len(updates) else torch.zeros(num_envs, dtype=torch.bool)
        values = torch.zeros((num_steps, num_envs))
        log_probs = torch.zeros((num_steps, num_envs, 1))
        stored_memory_masks = torch.zeros((num_steps, num_envs, args.trxl_memory_length), dtype=torch.bool)
        stored_memory_index = torch.zeros((num_steps, num_envs), dtype=torch.long)
        stored_memory_indices = torch.zeros((num_steps, num_envs, args.trxl_memory_length), dtype=torch.long)

        # Init episodic memory buffer using each environments' current episodic memory
        stored_memories = [next_memory[e] for e in range(num_envs)]
        for e in range(num_envs):
            stored_memory_index[:, e] = e

        for step in range(num_steps):
            with torch.no_grad():
                next_obs = obs[step]
                stored_memory_masks[step] = memory_mask[torch.clip(env_current_episode_step, 0, args.trxl_memory_length - 1)]
                stored_memory_indices[step] = memory_indices[env_current_episode_step]
                memory_window = ns.batched_index_select(next_memory, 1, stored_memory_indices[step])
                action, logprob, _, value, new_memory = agent.get_action_and_value(
                    next_obs, memory_window, stored_memory_masks[step], stored_memory_indices[step], actions[step]
                )
                next_memory[env_ids, env_current_episode_step] = new_memory
                log_probs[step], values[step] = logprob, value

            next_done = starts[step + 1] if step + 1 < num_steps else following  # fleetrl's episode ends
            for id, done in enumerate(next_done):
                if done:
                    env_current_episode_step[id] = 0
                    mem_index = stored_memory_index[step, id]
                    stored_memories[mem_index] = stored_memories[mem_index].clone()
                    next_memory[id] = torch.zeros((max_episode_steps, args.trxl_num_layers, args.trxl_dim), dtype=torch.float32)
                    if step < num_steps - 1:
                        stored_memories.append(next_memory[id])
                        stored_memory_index[step + 1 :, id] = len(stored_memories) - 1
                else:
                    env_current_episode_step[id] += 1
        out.append(dict(values=values, log_probs=log_probs, stored_memory_index=stored_memory_index, stored_memory_indices=stored_memory_indices,
                        stored_memory_masks=stored_memory_masks, stored_memories=torch.stack(stored_memories, dim=0)))
    return out


def replay_update(ns: SimpleNamespace, args: Any, observation_space, action_space_shape, max_episode_steps: int, update: Update,
                  acted: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[float]]:
    """CleanRL's update lines (from "Flatten the batch" to the epochs' end) on fleetrl's rollout (its observations,
    actions, log-probabilities, values, advantages and returns) and CleanRL's own memory storage (``acted``), from
    fleetrl's weights, AdamW state and torch RNG state before the update. Returns the weights after, and the losses."""
    agent = ns.Agent(args, observation_space, action_space_shape, max_episode_steps)
    agent.load_state_dict(update.weights_before)
    optimizer = torch.optim.AdamW(agent.parameters(), lr=args.init_lr)
    optimizer.load_state_dict(update.optimizer_before)
    for param_group in optimizer.param_groups:
        param_group["lr"] = update.lr
    ent_coef = update.ent_coef
    torch.set_rng_state(update.rng_before)
    batch_size, minibatch_size = args.num_envs * args.num_steps, args.num_envs * args.num_steps // args.num_minibatches
    shape = (args.num_steps, args.num_envs)
    stored_memory_indices, stored_memory_masks = acted["stored_memory_indices"], acted["stored_memory_masks"]
    stored_memories = acted["stored_memories"]
    losses = []

    # Flatten the batch
    b_obs = update.batch["obs"].float()
    b_logprobs = update.batch["logprobs"].reshape(-1, 1)
    b_actions = update.batch["actions"].reshape(-1, 1).long()
    b_advantages = update.batch["advantages"].reshape(shape).reshape(-1)
    b_returns = update.batch["returns"].reshape(shape).reshape(-1)
    b_values = update.batch["values"].reshape(shape).reshape(-1)
    b_memory_index = acted["stored_memory_index"].reshape(-1)
    b_memory_indices = stored_memory_indices.reshape(-1, *stored_memory_indices.shape[2:])
    b_memory_mask = stored_memory_masks.reshape(-1, *stored_memory_masks.shape[2:])

    # Remove unnecessary padding from TrXL memory, if applicable
    actual_max_episode_steps = (stored_memory_indices * stored_memory_masks).max().item() + 1
    if actual_max_episode_steps < args.trxl_memory_length:
        b_memory_indices = b_memory_indices[:, :actual_max_episode_steps]
        b_memory_mask = b_memory_mask[:, :actual_max_episode_steps]
        stored_memories = stored_memories[:, :actual_max_episode_steps]

    # Optimizing the policy and value network
    for epoch in range(args.update_epochs):
        b_inds = torch.randperm(batch_size)
        for start in range(0, batch_size, minibatch_size):
            end = start + minibatch_size
            mb_inds = b_inds[start:end]
            mb_memories = stored_memories[b_memory_index[mb_inds]]
            mb_memory_windows = ns.batched_index_select(mb_memories, 1, b_memory_indices[mb_inds])

            _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
                b_obs[mb_inds], mb_memory_windows, b_memory_mask[mb_inds], b_memory_indices[mb_inds], b_actions[mb_inds]
            )

            # Policy loss
            mb_advantages = b_advantages[mb_inds]
            if args.norm_adv:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            mb_advantages = mb_advantages.unsqueeze(1).repeat(1, len(action_space_shape))
            logratio = newlogprob - b_logprobs[mb_inds]
            ratio = torch.exp(logratio)
            pgloss1 = -mb_advantages * ratio
            pgloss2 = -mb_advantages * torch.clamp(ratio, 1.0 - args.clip_coef, 1.0 + args.clip_coef)
            pg_loss = torch.max(pgloss1, pgloss2).mean()

            # Value loss
            v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
            if args.clip_vloss:
                v_loss_clipped = b_values[mb_inds] + (newvalue - b_values[mb_inds]).clamp(min=-args.clip_coef, max=args.clip_coef)
                v_loss = torch.max(v_loss_unclipped, (v_loss_clipped - b_returns[mb_inds]) ** 2).mean()
            else:
                v_loss = v_loss_unclipped.mean()

            # Entropy loss
            entropy_loss = entropy.mean()

            # Combined losses
            loss = pg_loss - ent_coef * entropy_loss + v_loss * args.vf_coef

            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(agent.parameters(), max_norm=args.max_grad_norm)
            optimizer.step()
            losses.append(loss.item())

            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()

        if args.target_kl is not None and approx_kl > args.target_kl:
            break
    return agent.state_dict(), losses
