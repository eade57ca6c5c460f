"""Test-wide settings: a non-interactive matplotlib backend and a fixed torch thread count."""

import os

os.environ.setdefault("MPLBACKEND", "agg")

import matplotlib  # noqa: E402

matplotlib.use("agg")

from klviz.notebook import use_one_thread_on_small_machines  # noqa: E402

use_one_thread_on_small_machines()  # the same setting the lessons run with
