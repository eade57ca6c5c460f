"""Test-wide settings: a non-interactive matplotlib backend and a fixed torch thread count."""
import os

os.environ.setdefault("MPLBACKEND", "agg")

import matplotlib  # noqa: E402

matplotlib.use("agg")
