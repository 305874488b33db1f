// Spaces (an operator admin key): every space, and a form to create one.

import type { TargetedEvent } from "preact";
import { useState } from "preact/hooks";
import { get, post } from "../api";
import { useData } from "../live";
import { ErrorBox, Loadable, Page, Table, Time } from "../ui";

interface Space {
  id: string;
  name: string | null;
  createdAt: string;
}

export function SpacesPage() {
  const loaded = useData((signal) => get<{ spaces: Space[] }>("/v1/spaces", { signal }), []);
  const [id, setId] = useState("");
  const [name, setName] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [created, setCreated] = useState<string | null>(null);
  const create = async (event: TargetedEvent<HTMLFormElement>) => {
    event.preventDefault();
    setError(null);
    setCreated(null);
    try {
      const space = await post<Space>("/v1/spaces", { id: id.trim(), ...(name.trim() ? { name: name.trim() } : {}) });
      setCreated(space.id);
      setId("");
      setName("");
      loaded.reload();
    } catch (failure) {
      setError(failure);
    }
  };
  return (
    <Page name="spaces" title="Spaces">
      <form class="inline-form" data-form="create-space" onSubmit={create}>
        <label>
          Id <input name="id" value={id} required onInput={(event) => setId(event.currentTarget.value)} />
        </label>
        <label>
          Name <input name="name" value={name} onInput={(event) => setName(event.currentTarget.value)} />
        </label>
        <button type="submit" class="primary" data-action="create">Create space</button>
      </form>
      <ErrorBox error={error} />
      {created ? (
        <p class="notice" data-created={created}>
          Created space <strong>{created}</strong>. Create its first key on the API keys page of an operator
          key (POST /v1/keys with this space).
        </p>
      ) : null}
      <Loadable loaded={loaded}>
        {(data) => (
          <Table
            name="spaces"
            rows={data.spaces}
            rowId={(space) => space.id}
            empty="No spaces."
            columns={[
              { title: "Id", cell: (space) => <strong>{space.id}</strong> },
              { title: "Name", cell: (space) => space.name ?? <span class="muted">—</span> },
              { title: "Created", cell: (space) => <Time value={space.createdAt} /> },
            ]}
          />
        )}
      </Loadable>
    </Page>
  );
}
