"""One readable file per algorithm, each on the same engine.

Each module exposes:
* ``Args``: its flags, a dataclass subclassing :class:`fleetrl.args.CommonArgs` (CleanRL's names and defaults);
* ``FAMILY_DEFAULTS``: the defaults of the flags left ``None``, per env family (a family it lacks is refused);
* ``RANGES`` and ``validate(args, world_size)``: what it refuses before anything starts;
* ``train(args, explicit=None)``: the whole algorithm, top to bottom, in a :class:`fleetrl.run.Run`;
* ``policy_from_checkpoint(state, envs, deterministic)``: ``obs -> action`` for ``fleetrl eval``
  (:func:`fleetrl.policy.policy_fn` of a network implementing :class:`fleetrl.policy.Policy`).
``fleetrl train``, ``eval``, ``benchmark`` and ``tune`` work for every algorithm listed here.
"""

ALGOS = ("ppo", "ppo_lstm", "ppg", "ppo_rnd", "dqn", "c51", "rainbow", "pqn", "sac", "sac_discrete", "td3", "ddpg")
