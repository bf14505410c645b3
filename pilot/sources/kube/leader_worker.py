"""The life cycle every leader-only writer shares: the leader election starts it when this
replica leads and stops it when leadership is lost; in between one task runs `_run`."""

from __future__ import annotations

import asyncio


class LeaderWorker:
    task_name = "leader-worker"

    def __init__(self) -> None:
        self.active = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def _on_start(self) -> None:
        """What to (re)do on gaining leadership, before the task runs."""

    async def _run(self) -> None:
        raise NotImplementedError

    # The leader election calls these.
    async def start(self) -> None:
        self.active = True
        self._on_start()
        self._wake.set()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.task_name)

    async def stop(self) -> None:
        self.active = False
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
