// Cluster: every node of GET /v1/cluster (role, term, commit and applied index, reachable or not,
// the leader, the last scheduled backup). The view is node-local; it is polled, since membership is not in the event log.

import { useEffect } from "preact/hooks";
import { get } from "../api";
import { useData } from "../live";
import { Loadable, Page, StateBadge, Table } from "../ui";

const CLUSTER_POLL_MS = 2000;

export interface ClusterNode {
  id: string;
  apiUrl: string | null;
  reachable: boolean;
  status?: string;
  role?: string;
  leader?: string | null;
  term?: number;
  appliedIndex?: number;
  commitIndex?: number;
  longPolls?: number;
  error?: string;
  // The last scheduled backup this node took (README "Backups and restore"), null when none.
  backup?: ClusterBackup | null;
}

export interface ClusterBackup {
  at: number | null;
  file: string | null;
  index: number;
  bytes: number;
  seconds: number;
  failures: number;
  lastError: string | null;
}

const MIB = 1024 * 1024;

function BackupCell({ backup }: { backup: ClusterBackup | null | undefined }) {
  if (!backup) return <span class="muted">—</span>;
  const taken = backup.at === null ? null : new Date(backup.at);
  return (
    <span data-backup={taken ? "taken" : "failed"} title={backup.file ?? backup.lastError ?? ""}>
      {taken ? (
        <>
          {taken.toLocaleString()} <span class="muted">at index {backup.index}, {(backup.bytes / MIB).toFixed(1)} MiB</span>
        </>
      ) : (
        "none yet"
      )}
      {backup.failures > 0 ? (
        <span class="error-text" data-backup-failures>
          {" "}
          {backup.failures} failed{backup.lastError ? `: ${backup.lastError}` : ""}
        </span>
      ) : null}
    </span>
  );
}

export interface ClusterView {
  leader: string | null;
  nodes: ClusterNode[];
}

export function ClusterPage() {
  const loaded = useData((signal) => get<ClusterView>("/v1/cluster", { signal }), []);
  useEffect(() => {
    const id = window.setInterval(loaded.reload, CLUSTER_POLL_MS);
    return () => window.clearInterval(id);
  }, [loaded.reload]);
  return (
    <Page name="cluster" title="Cluster">
      <Loadable loaded={loaded}>
        {(view) => {
          const up = view.nodes.filter((node) => node.reachable).length;
          return (
            <>
              <p class="summary" data-summary>
                {view.nodes.length} node{view.nodes.length === 1 ? "" : "s"}, {up} answering; leader:{" "}
                <strong data-leader>{view.leader ?? "none"}</strong>
                <span class="muted"> (as node {location.host} sees it)</span>
              </p>
              <Table
                name="nodes"
                rows={[...view.nodes].sort((a, b) => a.id.localeCompare(b.id))}
                rowId={(node) => node.id}
                columns={[
                  { title: "Node", cell: (node) => <strong>{node.id}</strong> },
                  {
                    title: "State",
                    cell: (node) => (
                      <span data-node-state={node.reachable ? "up" : "down"}>
                        <StateBadge state={node.reachable ? "UP" : "DOWN"} />
                      </span>
                    ),
                  },
                  { title: "Role", cell: (node) => (node.reachable ? <StateBadge state={(node.role ?? "?").toUpperCase()} /> : "—") },
                  { title: "Leader", cell: (node) => (node.id === view.leader ? "★ leader" : "") },
                  { title: "Term", cell: (node) => node.term ?? "—", class: "num" },
                  { title: "Commit index", cell: (node) => node.commitIndex ?? "—", class: "num" },
                  { title: "Applied index", cell: (node) => node.appliedIndex ?? "—", class: "num" },
                  { title: "Long polls", cell: (node) => node.longPolls ?? "—", class: "num" },
                  { title: "Last backup", cell: (node) => <BackupCell backup={node.backup} /> },
                  {
                    title: "API",
                    cell: (node) => (
                      <span class="mono">
                        {node.apiUrl ?? "—"}
                        {node.error ? <span class="muted"> {node.error}</span> : null}
                      </span>
                    ),
                  },
                ]}
              />
            </>
          );
        }}
      </Loadable>
    </Page>
  );
}
