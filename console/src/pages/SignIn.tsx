// Sign-in: a space id and an API key, checked with GET /v1/whoami and kept in sessionStorage.
// A node without auth (GET /v1/whoami answers without a key) signs in by itself, with no form: to
// the space the page's ?space= names, else the default space.

import type { TargetedEvent } from "preact";
import { useEffect, useState } from "preact/hooks";
import { ApiError, get, lastSignOutMessage, signIn, type WhoAmI } from "../api";
import { HOME } from "../routes";
import { ErrorBox, Loading } from "../ui";

/** The space a link names (/console/?space=<id>), else the default space. */
export function spaceFromUrl(): string {
  return new URLSearchParams(location.search).get("space")?.trim() || "default";
}

function goHome(): void {
  if (!location.hash || location.hash === "#" || location.hash === "#/") location.hash = `#${HOME}`;
}

export function SignInPage() {
  const [space, setSpace] = useState("default");
  const [key, setKey] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const [noAuth, setNoAuth] = useState<boolean | null>(null);
  const message = lastSignOutMessage();

  useEffect(() => {
    // Without a key a node with auth answers 401; one without auth says who we are.
    get<WhoAmI>("/v1/whoami", { key: null, noSignOut: true }).then(
      (who) => {
        if (who.auth) {
          setNoAuth(false);
          return;
        }
        signIn({ space: spaceFromUrl(), key: null, keyId: null, permissions: who.permissions, operator: who.operator, auth: false });
        goHome();
      },
      () => setNoAuth(false),
    );
  }, []);

  const submit = async (event: TargetedEvent<HTMLFormElement>) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    const spaceId = space.trim() || "default";
    const secret = key.trim();
    try {
      if (!secret) throw new Error("Enter an API key.");
      const who = await get<WhoAmI>("/v1/whoami", { key: secret, noSignOut: true });
      if (who.auth && who.space !== spaceId) {
        throw new Error(`This key belongs to the space "${who.space}", not "${spaceId}".`);
      }
      signIn({
        space: spaceId,
        key: secret,
        keyId: who.keyId,
        permissions: who.permissions,
        operator: who.operator,
        auth: who.auth,
      });
      goHome();
    } catch (failure) {
      if (failure instanceof ApiError && failure.status === 401) {
        setError(new Error("That API key is not valid (unknown, revoked or expired)."));
      } else {
        setError(failure);
      }
    } finally {
      setBusy(false);
    }
  };

  if (noAuth !== false) return <Loading />; // asking the node whether it needs a key (none: signed in by itself)
  return (
    <section class="page signin" data-page="sign-in">
      <form class="signin-form" onSubmit={submit}>
        <h1>runstate console</h1>
        <p class="muted">Node at {location.origin}</p>
        {message ? <div class="notice" data-signed-out>{message}</div> : null}
        <label>
          Space
          <input name="space" value={space} autocomplete="off" spellcheck={false}
            onInput={(event) => setSpace(event.currentTarget.value)} />
        </label>
        <label>
          API key
          <input name="key" type="password" value={key} autocomplete="off" spellcheck={false}
            onInput={(event) => setKey(event.currentTarget.value)} />
        </label>
        <ErrorBox error={error} />
        <button type="submit" class="primary" data-action="sign-in" disabled={busy}>
          {busy ? "Signing in…" : "Sign in"}
        </button>
        <p class="muted small">The key stays in this browser tab only (session storage) and is sent to this node only.</p>
      </form>
    </section>
  );
}
