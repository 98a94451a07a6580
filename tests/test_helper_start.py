"""Starting a helper process (ipc/spawn.start_helper) when its first message cannot be sent."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any, Dict, List

import pytest

from pytriton.ipc.spawn import start_helper


def test_a_first_message_that_cannot_be_sent_raises_and_leaves_no_unretrieved_future() -> None:
    """The channel's close ended the answer's future with HelperDidNotStart, which no one awaited: asyncio logged
    'Future exception was never retrieved' beside the error the caller got."""
    reported: List[Dict[str, Any]] = []

    async def start() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
        with pytest.raises(TypeError, match="lock"):
            await start_helper("pytriton.ipc.spawn", (("first", threading.Lock()), []), 10)
        gc.collect()  # the future's end of life, where asyncio reports an exception never retrieved
        await asyncio.sleep(0)

    asyncio.run(start())
    assert [context.get("message") for context in reported] == []
