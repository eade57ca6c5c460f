# jupyterhub_config.py: klviz for a class on one machine (see the README, "JupyterHub").
# Each student is a Unix user of this machine (LocalProcessSpawner): their files are theirs and their
# server runs with their rights only. A student's server copies the lessons into ~/klviz-lessons (once;
# a lesson they edited is never overwritten) and opens lesson 00.
import sys
from pathlib import Path

env = Path(sys.executable).parent  # the environment that holds jupyterhub, klviz and JupyterLab

c.JupyterHub.bind_url = "http://:8000"
c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
c.Authenticator.allowed_users = {"student1", "student2"}  # your class; PAM checks their Unix passwords
c.Spawner.cmd = [
    "/bin/sh",
    "-c",
    f'"{env}/klviz" lab --copy-only "$HOME/klviz-lessons" && exec "{env}/jupyterhub-singleuser" "$@"',
    "klviz-singleuser",
]
c.Spawner.default_url = "/lab/tree/klviz-lessons/00_start_here.ipynb"
# glibc returns a kernel's large blocks of memory when freed (a third less at peak: see the README's sizing)
c.Spawner.environment = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "1048576"}
