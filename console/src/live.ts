// Loading and live updates for pages.
//
// useData(load, deps): runs load once per deps (and on reload()), keeps the last data while a
// reload runs, and reloads when the node answers again after the banner.
// useLive(filter, reload): long-polls GET /v1/spaces/{space}/watch from the newest event on and
// calls reload (debounced) when events match; resumes from its cursor, starts again from the
// newest on CURSOR_EXPIRED, stops when the page unmounts. Each open watch holds one of the
// browser's (about six) connections to the node: use one per page, with a filter covering what
// the page shows, rather than one per table.

import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, get, recoveryCount, spacePath, subscribe } from "./api";

const WATCH_WAIT_S = 20;
const NO_EVENT_TYPE = "console.none";
const RELOAD_DEBOUNCE_MS = 300; // at most a few reloads a second
const RETRY_MS = 2000;

export interface Loaded<T> {
  data: T | undefined;
  error: unknown;
  loading: boolean;
  reload: () => void;
}

export function useData<T>(load: (signal: AbortSignal) => Promise<T>, deps: unknown[]): Loaded<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<unknown>(null);
  const [loading, setLoading] = useState(true);
  const [tick, setTick] = useState(0);
  const recovered = useRecoveries();
  useEffect(() => {
    const controller = new AbortController();
    setLoading(true);
    load(controller.signal).then(
      (value) => {
        if (controller.signal.aborted) return;
        setData(value);
        setError(null);
        setLoading(false);
      },
      (failure) => {
        if (controller.signal.aborted) return;
        setError(failure);
        setLoading(false);
      },
    );
    return () => controller.abort();
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [...deps, tick, recovered]);
  return { data, error, loading, reload: () => setTick((value) => value + 1) };
}

/** Bumps when the node answers again after not answering. */
export function useRecoveries(): number {
  const [count, setCount] = useState(recoveryCount());
  useEffect(() => subscribe(() => setCount(recoveryCount())), []);
  return count;
}

export interface LiveFilter {
  types?: string[];
  aggregate?: string;
  scopeId?: string;
}

interface EventsPage {
  events: unknown[];
  nextCursor: string;
}

export function useLive(filter: LiveFilter | null, reload: () => void): void {
  const reloadRef = useRef(reload);
  reloadRef.current = reload;
  const key = filter === null ? null : JSON.stringify(filter);
  useEffect(() => {
    if (filter === null) return;
    const controller = new AbortController();
    const signal = controller.signal;
    let timer: number | null = null;
    const schedule = () => {
      if (timer === null) {
        timer = window.setTimeout(() => {
          timer = null;
          if (!signal.aborted) reloadRef.current();
        }, RELOAD_DEBOUNCE_MS);
      }
    };
    const query = {
      types: filter.types?.join(","),
      aggregate: filter.aggregate,
      scopeId: filter.scopeId,
    };
    const page = (cursor: string | null, waitSeconds: number) =>
      get<EventsPage>(spacePath("/watch"), { query: { ...query, cursor, waitSeconds }, signal });
    // The newest cursor in one call: a page that matches nothing ends at the latest event looked
    // at, which is the newest (no event type is named this).
    const newest = async (): Promise<string> =>
      (await get<EventsPage>(spacePath("/watch"), { query: { types: NO_EVENT_TYPE, waitSeconds: 0, limit: 1 }, signal })).nextCursor;
    const sleep = (ms: number) =>
      new Promise<void>((resolve) => {
        const id = window.setTimeout(resolve, ms);
        signal.addEventListener("abort", () => {
          window.clearTimeout(id);
          resolve();
        });
      });
    (async () => {
      let cursor: string | null = null;
      let caughtUp = false;
      while (!signal.aborted) {
        try {
          if (!caughtUp) {
            cursor = await newest();
            caughtUp = true;
            schedule(); // what changed between the page's load and this cursor is not missed
          }
          const found: EventsPage = await page(cursor, WATCH_WAIT_S);
          cursor = found.nextCursor;
          if (found.events.length > 0) schedule();
        } catch (error) {
          if (signal.aborted) return;
          if (error instanceof ApiError && error.code === "CURSOR_EXPIRED") {
            caughtUp = false;
            schedule();
            continue;
          }
          if (error instanceof ApiError && error.status === 401) return; // signed out
          await sleep(RETRY_MS);
        }
      }
    })();
    return () => {
      controller.abort();
      if (timer !== null) window.clearTimeout(timer);
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [key]);
}
