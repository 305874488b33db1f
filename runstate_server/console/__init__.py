"""The web console's built files (static/: index.html, app.js, app.css), bundled from console/ at
the repository's root by `cd console && npm ci && npm run build` and committed, so the server
package needs no Node.js. runstate_server.node.api.console serves them."""
