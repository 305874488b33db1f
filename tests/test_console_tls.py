"""The console over HTTPS (`runstate dev --tls-cert`): its files, its sign-in and its calls all go
over the page's own origin, so a node serving HTTPS serves a working console (no http:// URL, no
mixed content), in a real browser."""

from __future__ import annotations

from pathlib import Path

from runstate_server.node.certs import certs_init
from tests._browser import Console
from tests.test_tls import TlsDevNode, client_context


def test_the_console_works_over_https(tmp_path: Path, console: Console) -> None:
    certs = tmp_path / "certs"
    certs_init(certs, ["n1"], [], 30)
    node = TlsDevNode(tmp_path / "data", client_context(certs), "--tls-cert", str(certs / "n1.pem"),
                      "--tls-key", str(certs / "n1.key"))
    try:
        node.start()
        page = console.new_page(ignore_https_errors=True)
        insecure: list[str] = []
        page.on("request", lambda request: insecure.append(request.url) if request.url.startswith("http:") else None)
        console.open(node.url, page=page)
        page.locator('[data-page="overview"]').wait_for()  # signed in, and its first call answered
        assert page.url.startswith("https://")
        assert insecure == []
        console.screenshot(page, "console-over-https")
    finally:
        node.stop()
