"""`fleetrl <command>`: train, eval, bench-env, benchmark, tune, plot, compare.

    fleetrl train ppo --env-id CartPole-v1
    fleetrl eval runs/CartPole-v1__ppo__1__1700000000 --episodes 10

Bad input ends in one clear paragraph and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import sys

import tyro

from fleetrl.algos import ALGOS
from fleetrl.errors import FleetError, exit_on_error

USAGE = """usage: fleetrl <command> [flags]

commands:
  train ALGO [flags]   train an algorithm (ALGO: {algos}, or your file ./my_algo.py or module mypkg.my_algo); `fleetrl train ppo --help` lists its flags
  new NAME --from ALGO write NAME.py, your own copy of a built-in algorithm to change (docs/engine.md); `fleetrl new --help`
  eval CHECKPOINT      evaluate a checkpoint or run folder; `fleetrl eval --help`
  export CHECKPOINT    the trained policy as an ONNX or TorchScript file that plays without fleetrl; `fleetrl export --help`
  bench-env            env throughput per backend and number of envs; what `auto` picks; `fleetrl bench-env --help`
  benchmark -- CMD     run CMD for env ids x seeds on a worker pool, then summarise; `fleetrl benchmark --help`
  tune -- CMD          search hyperparameters of CMD (`fleetrl train ...`) with Optuna: parallel trials, pruning; `fleetrl tune --help`
  plot PATHS -o FILE   learning curves (mean ± std over seeds, a panel per env) of the runs under PATHS; `fleetrl plot --help`
  compare DIR DIR ...  configurations side by side: IQM etc. with bootstrap intervals, probability of improvement, figures; `fleetrl compare --help`
  preflight            check CPU cores, GPU and driver, env throughput before a long run; `fleetrl preflight --help`
  minicluster up|down  a throwaway 2-node Slurm cluster on this machine (root); `fleetrl minicluster --help`
"""


def _train(argv: list[str]) -> None:
    from fleetrl.algos.source import train_command_line

    train_command_line(argv)


def _new(argv: list[str]) -> None:
    from fleetrl.tools.new import NewArgs, new

    new(tyro.cli(NewArgs, args=argv, prog="fleetrl new"))


def _eval(argv: list[str]) -> None:
    from fleetrl.evaluate import EvalArgs, evaluate

    evaluate(tyro.cli(EvalArgs, args=argv, prog="fleetrl eval"))


def _export(argv: list[str]) -> None:
    from fleetrl.export import main

    main(argv)


def _benchmark(argv: list[str]) -> None:
    from fleetrl.tools.benchmark import DESCRIPTION, BenchmarkArgs, run_benchmark
    from fleetrl.tools.runs import split_command, with_absolute_algo_file

    flags, command = split_command(argv)
    run_benchmark(tyro.cli(BenchmarkArgs, args=flags, prog="fleetrl benchmark", description=DESCRIPTION), with_absolute_algo_file(command))


def _tune(argv: list[str]) -> None:
    from fleetrl.tools.runs import split_command, with_absolute_algo_file
    from fleetrl.tools.tune import DESCRIPTION, TuneArgs, run_tune

    flags, command = split_command(argv)
    run_tune(tyro.cli(TuneArgs, args=flags, prog="fleetrl tune", description=DESCRIPTION), with_absolute_algo_file(command))


def _plot(argv: list[str]) -> None:
    from fleetrl.tools.plot import PlotArgs, plot

    plot(tyro.cli(PlotArgs, args=argv, prog="fleetrl plot"))


def _compare(argv: list[str]) -> None:
    from fleetrl.tools.compare import CompareArgs, compare

    compare(tyro.cli(CompareArgs, args=argv, prog="fleetrl compare"), argv)


def _bench_env(argv: list[str]) -> None:
    from fleetrl.tools.bench_env import BenchEnvArgs, bench_env

    bench_env(tyro.cli(BenchEnvArgs, args=argv, prog="fleetrl bench-env"))


def _preflight(argv: list[str]) -> None:
    from fleetrl.tools.preflight import PreflightArgs, preflight

    preflight(tyro.cli(PreflightArgs, args=argv, prog="fleetrl preflight"))


def _minicluster(argv: list[str]) -> None:
    from fleetrl.tools.runs import split_command
    from fleetrl.tools.minicluster import MiniClusterArgs, main

    flags, command = split_command(argv)
    main(tyro.cli(MiniClusterArgs, args=flags, prog="fleetrl minicluster"), command)


COMMANDS = {"train": _train, "new": _new, "eval": _eval, "export": _export, "bench-env": _bench_env, "benchmark": _benchmark, "tune": _tune, "plot": _plot, "compare": _compare,
            "preflight": _preflight, "minicluster": _minicluster}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE.format(algos=", ".join(ALGOS)))
        sys.exit(0 if argv else 2)
    command = COMMANDS.get(argv[0])
    if command is None:
        command = _unknown(argv[0])
    exit_on_error(command, argv[1:])


def _unknown(name: str):
    def refuse(argv: list[str]) -> None:
        raise FleetError(f"Unknown command {name!r}. Commands: {', '.join(COMMANDS)}. Run `fleetrl --help`.")
    return refuse
