"""The ``kubernetes`` provider attacked, against the fake API server (fixtures ``k8s`` and ``make``
in tests/conftest.py): what sandboxed code plants in its own files, what a hostile API server
answers, and faults at the worst moment."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.kubernetes_support import WS, Make, thread_id

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="the fake API server runs each pod as a bubblewrap sandbox, started as root",
)


async def test_a_link_to_an_unreadable_directory_does_not_block_the_thread(make: Make) -> None:
    """The disk-usage walk (engine_script.op_usage) never follows a link: one pointing at a
    directory the sandbox user cannot read (``ln -s /root``) is a link of a few bytes, not an
    unreadable directory of the thread's that blocks its commands and writes until removed."""
    sb = await make().acquire(thread_id())
    res = await sb.exec("mkdir /tmp/locked && chmod 000 /tmp/locked && ln -s /tmp/locked locked && echo made")
    assert res.output.strip() == "made", res
    assert (await sb.exec("echo still")).output.startswith("still")
    await sb.write_file(f"{WS}/after.txt", "written\n")
    assert (await sb.read_file("after.txt")).text == "written\n"
    # A directory of the thread's own that it made unreadable still counts as unmeasurable.
    res = await sb.exec("mkdir mine && chmod 000 mine && echo made")
    assert "not readable" in res.output, res
