"""Start JupyterLab for the lessons: bound to 127.0.0.1, protected by a random token, URL printed.

``python -m klviz.labserver --notebook-dir notebooks`` is what ``make lab`` runs.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["lab_command", "start_lab", "main"]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _pick_port(preferred: int) -> int:
    for port in range(preferred, preferred + 50):
        if _port_free(port):
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet_settings() -> None:
    """No news toast and no update check: both would try the network on first start."""
    cfg = Path(os.environ.get("JUPYTER_CONFIG_DIR", Path.home() / ".jupyter"))
    path = cfg / "lab/user-settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


def lab_command(notebook_dir: Path, port: int, token: str) -> list[str]:
    """The ``jupyter lab`` command line: localhost only, token required, no browser launched."""
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebook_dir}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd


def start_lab(notebook_dir: str | Path, port: int = 8888, token: str | None = None,
              first_notebook: str | None = "00_start_here.ipynb") -> int:
    """Run JupyterLab in the foreground until Ctrl-C; prints the URL with its token first."""
    root = Path(notebook_dir).resolve()
    if not root.is_dir():
        print(f"klviz: notebook folder {root} does not exist", file=sys.stderr)
        return 2
    token = token or secrets.token_hex(24)
    port = _pick_port(port)
    _quiet_settings()
    page = f"lab/tree/{first_notebook}" if first_notebook and (root / first_notebook).exists() else "lab"
    url = f"http://127.0.0.1:{port}/{page}?token={token}"
    print("\n  klviz lessons in JupyterLab (localhost only, token required):\n"
          f"      {url}\n  Open that URL in your browser; stop the server with Ctrl-C.\n", flush=True)
    try:
        return subprocess.call(lab_command(root, port, token), cwd=root)
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m klviz.labserver", description=__doc__)
    parser.add_argument("--notebook-dir", default="notebooks")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8888)))
    args = parser.parse_args(argv)
    return start_lab(args.notebook_dir, args.port)


if __name__ == "__main__":
    sys.exit(main())
