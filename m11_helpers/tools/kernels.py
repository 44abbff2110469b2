"""Notebook kernels for the m11 tools: tied to the tool that started them, and quiet.

Every tool that executes notebooks (`m11 course`, `m11 nbclean --refresh`, the wrong-answer runner)
starts its kernels through `notebook_client(...)` (or `TetheredKernelManager` directly):

- **Tethered.** The kernel runs under `m11_helpers.tether`'s supervisor. When the tool ends,
  however it ends (SIGKILL included), the supervisor kills the kernel and everything the notebook
  started: `launch()` ranks and their store, `launch_script` agents and ranks, any subprocess.
  jupyter_client alone puts the kernel in a session of its own and relies on ipykernel noticing that
  its parent is gone (it polls once a second, and only notices a re-parenting to pid 1), and
  nothing reaches what the kernel started.
- **IPC transport.** The kernel's five ZMQ channels are Unix sockets in a private temporary folder
  (mode 0700) instead of TCP ports on 127.0.0.1. ipykernel 7 warns "Kernel is running over TCP
  without encryption" on every start, to the terminal the tool prints to: with TCP, any local user
  can connect to the ports and read code and outputs in plain text. We remove the cause rather than
  silence the logger: the sockets are reachable by this user only, no port is taken, and no
  other kernel warning is hidden. The connection file lives in the same folder, which goes when the
  kernel shuts down (or, if the tool was killed, when the supervisor has killed the kernel).
  On Windows (no IPC transport; the course needs WSL there anyway) the kernel keeps TCP.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from m11_helpers.tether import tethered

__all__ = ["TetheredKernelManager", "notebook_client"]


class TetheredKernelManager(AsyncKernelManager):
    """An `AsyncKernelManager` (what nbclient uses) whose kernel is tethered and listens on IPC sockets."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # A short path: a Unix socket's path must fit in ~104 bytes (macOS), a runtime dir may not.
        self._private_dir = tempfile.mkdtemp(prefix="m11-kernel-")
        self.connection_file = os.path.join(self._private_dir, "kernel.json")
        if os.name == "posix":
            self.transport = "ipc"
            self.ip = os.path.join(self._private_dir, "ipc")  # sockets ipc-<port>

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        # Built (and started) in this process: the supervisor watches the process that calls this.
        return tethered(super().format_kernel_cmd(extra_arguments), remove_if_abandoned=[self._private_dir])

    async def _async_pre_start_kernel(self, **kwargs: Any):
        # A supervisor told to stop removes this folder: a restart after that needs it back.
        os.makedirs(self._private_dir, mode=0o700, exist_ok=True)
        return await super()._async_pre_start_kernel(**kwargs)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            shutil.rmtree(self._private_dir, ignore_errors=True)


def notebook_client(nb, *, cwd: str | os.PathLike, timeout: float, **kwargs: Any):
    """An nbclient `NotebookClient` for `nb`, run with cwd `cwd`, on a `TetheredKernelManager` python3 kernel.

    The kernel is killed at the end (`shutdown_kernel="immediate"`): a graceful shutdown waits up
    to 5 s for a kernel that has nothing left to save.
    """
    from nbclient import NotebookClient

    kwargs.setdefault("kernel_name", "python3")
    kwargs.setdefault("shutdown_kernel", "immediate")
    return NotebookClient(nb, timeout=timeout, kernel_manager_class=TetheredKernelManager,
                          resources={"metadata": {"path": str(cwd)}}, **kwargs)
