"""The console on a three-node cluster: opened on a follower (its files are node-local), the
Cluster page shows every node, the leader, and a node killed with kill -9 as down; the files are
still served by a node that has lost its quorum."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import pytest

from tests._browser import Console
from tests._cluster import Cluster

pytestmark = pytest.mark.slow  # three real nodes

LEADER_SHOWN_TIMEOUT_S = 30.0


def test_the_cluster_page_shows_a_killed_node_down(make_cluster: Callable[..., Cluster], console: Console) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    follower, dead = (leader + 1) % cluster.size, (leader + 2) % cluster.size
    page = console.open(cluster.urls[follower], key=cluster.admin_key)
    page.click('[data-nav-entry="cluster"]')
    for node_id in cluster.ids:
        page.locator(f'[data-table="nodes"] [data-row="{node_id}"] [data-node-state="up"]').wait_for()
    # The leader the nodes agree on; on loaded cores an election may move it meanwhile, and the
    # page shows the new one at its next refresh.
    deadline = time.monotonic() + LEADER_SHOWN_TIMEOUT_S
    while (shown := page.locator("[data-leader]").inner_text()) != cluster.ids[cluster.leader_index()]:
        assert time.monotonic() < deadline, f"the page shows {shown} as the leader"
        time.sleep(0.1)
    cluster.kill(dead)
    page.locator(f'[data-table="nodes"] [data-row="{cluster.ids[dead]}"] [data-node-state="down"]').wait_for()
    assert page.locator('[data-node-state="up"]').count() == 2
    console.screenshot(page, "cluster-node-down")

    cluster.kill(leader)  # no quorum now: the survivor still serves the console's files itself
    with urllib.request.urlopen(f"{cluster.urls[follower]}/console/", timeout=30) as answer:
        assert answer.status == 200 and b"app.js" in answer.read()
