"""Imported only by multiprocessing's forkserver (``set_forkserver_preload``, fleetrl/processes.py), never by the trainer.

SIGTERM to the whole process group (Slurm, Kubernetes) would end the forkserver. Its env workers would
live on, but multiprocessing then reports each of them as dead (exit code 255, read from the server's
closed pipe), and the trainer would restart them in the middle of its checkpoint-and-stop. The server
ignores SIGTERM and Ctrl-C instead, and so does every process it forks (env workers, the learner) from its
first instruction on: the trainer stops the run and closes them. The server still exits when the trainer
does (its pipe from the trainer closes).
"""

from fleetrl.processes import ignore_stop_signals

ignore_stop_signals()  # SIGINT too: the server restores it in each child to what it was here
