"""Imported only by multiprocessing's forkserver (``set_forkserver_preload``), never by the trainer.

SIGTERM to the whole process group (Slurm, Kubernetes) would end the forkserver. Its env workers would
live on, but multiprocessing then reports each of them as dead (exit code 255, read from the server's
closed pipe), and the trainer would restart them in the middle of its checkpoint-and-stop. The server
ignores SIGTERM instead; it still exits when the trainer does (its pipe from the trainer closes).
"""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
