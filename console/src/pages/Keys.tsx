// API keys of the space (an admin key): list, create with chosen permissions (the secret is shown
// once, with a copy button), revoke with a confirmation. Revoking the key this console signed in
// with signs it out at the next call.

import type { TargetedEvent } from "preact";
import { useState } from "preact/hooks";
import { currentSession, get, post } from "../api";
import { useData } from "../live";
import { Age, ConfirmButton, CopyButton, ErrorBox, Loadable, Page, StateBadge, Table, Time } from "../ui";

export const PERMISSIONS = ["admin", "resource_config", "coordination_write", "coordination_read"];

interface Key {
  id: string;
  space: string;
  name: string | null;
  permissions: string[];
  createdAt: string;
  revokedAt: string | null;
  createdBy: string | null;
  key?: string;
}

export function KeysPage() {
  const session = currentSession();
  const [space, setSpace] = useState(session?.space ?? "default");
  const loaded = useData((signal) => get<{ keys: Key[] }>("/v1/keys", { query: { space }, signal }), [space]);
  const [name, setName] = useState("");
  const [chosen, setChosen] = useState<string[]>(["coordination_read", "coordination_write"]);
  const [error, setError] = useState<unknown>(null);
  const [secret, setSecret] = useState<Key | null>(null);
  const create = async (event: TargetedEvent<HTMLFormElement>) => {
    event.preventDefault();
    setError(null);
    setSecret(null);
    try {
      const made = await post<Key>("/v1/keys", { space, name: name.trim() || undefined, permissions: chosen });
      setSecret(made); // in this answer only: never stored, gone on reload
      setName("");
      loaded.reload();
    } catch (failure) {
      setError(failure);
    }
  };
  const toggle = (permission: string) =>
    setChosen(chosen.includes(permission) ? chosen.filter((p) => p !== permission) : [...chosen, permission]);
  return (
    <Page name="keys" title="API keys">
      {session?.operator ? (
        <form class="inline-form" onSubmit={(event) => event.preventDefault()}>
          <label>
            Space <input name="space" value={space} onChange={(event) => setSpace(event.currentTarget.value.trim() || "default")} />
          </label>
          <span class="muted small">An operator admin key manages the keys of every space.</span>
        </form>
      ) : null}
      {session && !session.auth ? (
        <p class="notice" data-no-auth>
          This node runs without auth: it neither needs nor makes keys (start it with <code>--auth</code> to use them).
        </p>
      ) : (
      <form class="card" data-form="create-key" onSubmit={create}>
        <h2>Create a key</h2>
        <label>
          Name <input name="name" value={name} placeholder="e.g. ci-worker" onInput={(event) => setName(event.currentTarget.value)} />
        </label>
        <fieldset class="permissions">
          <legend>Permissions</legend>
          {PERMISSIONS.map((permission) => (
            <label class="check">
              <input type="checkbox" name={permission} checked={chosen.includes(permission)} onChange={() => toggle(permission)} />
              {permission}
            </label>
          ))}
        </fieldset>
        <button type="submit" class="primary" data-action="create" disabled={chosen.length === 0}>Create key</button>
        <ErrorBox error={error} />
      </form>
      )}
      {secret?.key ? (
        <div class="secret" data-secret={secret.id}>
          <p>
            The secret of <strong>{secret.name ?? secret.id}</strong>. It is shown this once: copy it now; the node keeps only
            its hash.
          </p>
          <div class="secret-row">
            <code data-secret-value>{secret.key}</code>
            <CopyButton text={secret.key} />
            <button type="button" data-action="hide-secret" onClick={() => setSecret(null)}>Done</button>
          </div>
        </div>
      ) : null}
      <Loadable loaded={loaded}>
        {(data) => (
          <Table
            name="keys"
            rows={data.keys}
            rowId={(key) => key.id}
            empty="No keys in this space."
            columns={[
              {
                title: "Key",
                cell: (key) => (
                  <>
                    <strong>{key.name ?? "—"}</strong>
                    <div class="mono small">{key.id}{key.id === session?.keyId ? " (this console)" : ""}</div>
                  </>
                ),
              },
              { title: "Permissions", cell: (key) => key.permissions.join(", "), class: "key-permissions" },
              { title: "Created", cell: (key) => <Time value={key.createdAt} /> },
              {
                title: "State",
                cell: (key) =>
                  key.revokedAt ? (
                    <span title={key.revokedAt}>
                      <StateBadge state="REVOKED" /> <Age since={key.revokedAt} /> ago
                    </span>
                  ) : (
                    <StateBadge state="ACTIVE" />
                  ),
              },
              {
                title: "",
                cell: (key) =>
                  key.revokedAt ? null : (
                    <ConfirmButton
                      action="revoke"
                      label="Revoke"
                      danger
                      question={key.id === session?.keyId ? "Revoke the key this console uses? You will be signed out." : "Revoke this key on every node?"}
                      onConfirm={async () => {
                        await post(`/v1/keys/${encodeURIComponent(key.id)}/revoke`);
                        loaded.reload();
                      }}
                    />
                  ),
              },
            ]}
          />
        )}
      </Loadable>
    </Page>
  );
}
