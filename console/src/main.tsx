// The console's shell: sign-in until there is a session (a node without auth signs in by itself),
// then the nav (from routes.ts), the "not answering" banner and the page the hash names.

import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { currentSession, get, hasPermission, isNodeDown, type Session, signIn, signOut, subscribe } from "./api";
import { SignInPage, spaceFromUrl } from "./pages/SignIn";
import { match, navigate, useHashPath } from "./router";
import { HOME, ROUTES, type RouteEntry } from "./routes";
import "./style.css";
import { Page } from "./ui";

function useStore<T>(read: () => T): T {
  const [value, setValue] = useState(read);
  useEffect(() => subscribe(() => setValue(read)), []);
  return value;
}

// How often the shell asks GET /v1/whoami: a revoked key signs out, a node that stopped answering
// raises the banner, even on a page that makes no call of its own meanwhile.
const HEARTBEAT_MS = 5000;

function useHeartbeat(signedIn: boolean): void {
  useEffect(() => {
    if (!signedIn) return;
    const controller = new AbortController();
    const id = window.setInterval(() => {
      get("/v1/whoami", { signal: controller.signal }).catch(() => undefined);
    }, HEARTBEAT_MS);
    return () => {
      window.clearInterval(id);
      controller.abort();
    };
  }, [signedIn]);
}

/** On a node without auth: the space shown, switched among the node's spaces (GET /v1/spaces). */
function SpaceSwitch(props: { session: Session }) {
  const [spaces, setSpaces] = useState<string[]>([props.session.space]);
  useEffect(() => {
    const controller = new AbortController();
    get<{ spaces: { id: string }[] }>("/v1/spaces", { signal: controller.signal }).then(
      (found) => setSpaces([...new Set([props.session.space, ...found.spaces.map((space) => space.id)])].sort()),
      () => undefined,
    );
    return () => controller.abort();
  }, [props.session.space]);
  const choose = (space: string) => {
    signIn({ ...props.session, space });
    navigate(HOME);
  };
  return (
    <select class="space-switch" data-space-switch aria-label="space" value={props.session.space}
      onChange={(event) => choose(event.currentTarget.value)}>
      {spaces.map((space) => <option value={space}>{space}</option>)}
    </select>
  );
}

function allowed(route: RouteEntry): boolean {
  if (!route.needs) return true;
  if (route.needs === "operator") return currentSession()?.operator === true;
  return hasPermission(route.needs);
}

function App() {
  const session = useStore(currentSession);
  const down = useStore(isNodeDown);
  const path = useHashPath();
  const [menuOpen, setMenuOpen] = useState(false);
  useHeartbeat(session !== null);
  useEffect(() => setMenuOpen(false), [path]);
  useEffect(() => {
    // A link naming a space (/console/?space=<id>) on a node without auth opens that space.
    const named = spaceFromUrl();
    if (session && !session.auth && location.search && named !== session.space) signIn({ ...session, space: named });
  }, []);
  const banner = down ? (
    <div class="banner" role="status" data-banner="down">
      The node at {location.origin} is not answering; retrying…
    </div>
  ) : null;
  if (session === null) {
    return (
      <div class="shell signed-out">
        {banner}
        <SignInPage />
      </div>
    );
  }
  const found = match(ROUTES, path);
  if (path === "/" || path === "") {
    navigate(HOME);
  }
  const entries = ROUTES.filter((route) => route.nav && allowed(route));
  const current = found ? found.route : null;
  const Component = found?.route.component;
  return (
    <div class="shell">
      <header class="topbar">
        <a class="brand" href={`#${HOME}`}>runstate</a>
        <button type="button" class="menu-toggle" data-action="menu" aria-expanded={menuOpen}
          onClick={() => setMenuOpen(!menuOpen)}>
          Menu
        </button>
        <nav class={menuOpen ? "nav open" : "nav"} data-nav>
          {entries.map((route) => (
            <a href={`#${route.path}`} data-nav-entry={route.path.slice(1)}
              class={current && (current === route || current.path.startsWith(`${route.path}/`)) ? "active" : undefined}>
              {route.nav}
            </a>
          ))}
        </nav>
        <div class="who" data-who>
          {session.auth ? (
            <>
              <span class="space" title="space">{session.space}</span>
              <span class="muted">{session.keyId}</span>
              <button type="button" data-action="sign-out" onClick={() => signOut(null)}>Sign out</button>
            </>
          ) : (
            <>
              <SpaceSwitch session={session} />
              <span class="muted" data-no-auth title="This node runs without auth (a dev node): no key is needed, and every call may do everything.">
                no auth
              </span>
            </>
          )}
        </div>
      </header>
      {banner}
      <main class="content">
        {Component && found ? (
          <Component params={found.params} key={path} />
        ) : (
          <Page name="not-found" title="Not found">
            <p>No page at <code>#{path}</code>. <a href={`#${HOME}`}>Go to the overview</a>.</p>
          </Page>
        )}
      </main>
    </div>
  );
}

render(<App />, document.getElementById("app")!);
