// The page table: each entry is a hash path pattern (":name" matches one segment), the component
// that renders it (given the matched params), and its nav label (none: not in the nav). `needs`
// hides the nav entry from a key that lacks that permission ("operator": an operator admin key).
// Add a page: write console/src/pages/<Name>.tsx and add its entries here.

import type { FunctionComponent } from "preact";
import { ClusterPage } from "./pages/Cluster";
import { KeysPage } from "./pages/Keys";
import { OverviewPage } from "./pages/Overview";
import { RunPage, RunsPage } from "./pages/Runs";
import { SpacesPage } from "./pages/Spaces";
// The pages of queues, tasks, groups, capacity and waits.
import { AllowancePage, BudgetPage, CapacityPage, PermitPage } from "./pages/Capacity";
import { BarriersPage, GroupPage, GroupsPage, TimersPage } from "./pages/Groups";
import { MailboxPage, QueuesPage } from "./pages/Queues";
import { TaskPage } from "./pages/Tasks";
import { WaitsPage } from "./pages/Waits";
import { WorkersPage } from "./pages/Workers";

export type Params = Record<string, string>;

export interface RouteEntry {
  path: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  component: FunctionComponent<{ params: any }>;
  nav?: string;
  needs?: string;
}

export const ROUTES: RouteEntry[] = [
  { path: "/overview", component: OverviewPage, nav: "Overview", needs: "coordination_read" },
  { path: "/runs", component: RunsPage, nav: "Runs", needs: "coordination_read" },
  { path: "/runs/:id", component: RunPage },
  { path: "/queues", component: QueuesPage, nav: "Queues", needs: "coordination_read" },
  { path: "/queues/:id", component: MailboxPage },
  { path: "/tasks/:id", component: TaskPage },
  { path: "/groups", component: GroupsPage, nav: "Groups", needs: "coordination_read" },
  { path: "/groups/:id", component: GroupPage },
  { path: "/barriers", component: BarriersPage },
  { path: "/timers", component: TimersPage },
  { path: "/capacity", component: CapacityPage, nav: "Capacity", needs: "coordination_read" },
  { path: "/permits/:id", component: PermitPage },
  { path: "/allowances/:id", component: AllowancePage },
  { path: "/budgets/:id", component: BudgetPage },
  { path: "/workers", component: WorkersPage, nav: "Workers", needs: "coordination_read" },
  { path: "/waits", component: WaitsPage, nav: "Waits", needs: "coordination_read" },
  { path: "/cluster", component: ClusterPage, nav: "Cluster" },
  { path: "/keys", component: KeysPage, nav: "API keys", needs: "admin" },
  { path: "/spaces", component: SpacesPage, nav: "Spaces", needs: "operator" },
];

// The landing page after sign-in. A key without coordination_read sees the overview's error (what
// the key lacks), as on any page it cannot read.
export const HOME = "/overview";
