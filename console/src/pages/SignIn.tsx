// Sign-in: a space id and an API key, checked with GET /v1/whoami and kept in sessionStorage.
// A node without auth says so and lets the user in without a key.

import type { TargetedEvent } from "preact";
import { useEffect, useState } from "preact/hooks";
import { ApiError, get, lastSignOutMessage, signIn, type WhoAmI } from "../api";
import { ErrorBox } from "../ui";

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
      (who) => setNoAuth(!who.auth),
      () => setNoAuth(false),
    );
  }, []);

  const submit = async (event: TargetedEvent<HTMLFormElement>) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    const spaceId = space.trim() || "default";
    const secret = noAuth ? null : key.trim();
    try {
      if (!noAuth && !secret) throw new Error("Enter an API key.");
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
      if (!location.hash || location.hash === "#" || location.hash === "#/") location.hash = "#/runs";
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

  return (
    <section class="page signin" data-page="sign-in">
      <form class="signin-form" onSubmit={submit}>
        <h1>runstate console</h1>
        <p class="muted">Node at {location.origin}</p>
        {message ? <div class="notice" data-signed-out>{message}</div> : null}
        {noAuth ? (
          <div class="notice" data-no-auth>
            This node runs without auth (a dev node): no key is needed, and every call may do everything.
          </div>
        ) : null}
        <label>
          Space
          <input name="space" value={space} autocomplete="off" spellcheck={false}
            onInput={(event) => setSpace(event.currentTarget.value)} />
        </label>
        {noAuth ? null : (
          <label>
            API key
            <input name="key" type="password" value={key} autocomplete="off" spellcheck={false}
              onInput={(event) => setKey(event.currentTarget.value)} />
          </label>
        )}
        <ErrorBox error={error} />
        <button type="submit" class="primary" data-action="sign-in" disabled={busy || noAuth === null}>
          {busy ? "Signing in…" : "Sign in"}
        </button>
        <p class="muted small">The key stays in this browser tab only (session storage) and is sent to this node only.</p>
      </form>
    </section>
  );
}
