// The fetch wrapper: every call goes to the page's own origin with the session's key; a 401 signs
// out with a message; a node that does not answer raises the "not answering" banner, which a
// background health check lowers again.

export const SESSION_KEY = "runstate.console.session";
const REQUEST_TIMEOUT_MS = 40_000; // above the watch's 20 s long poll plus a forwarded write
const RETRY_MS = 2_000; // while the node does not answer, how often to ask it again

export interface Session {
  space: string;
  key: string | null; // null: the node runs without auth
  keyId: string | null;
  permissions: string[];
  operator: boolean;
  auth: boolean;
}

export interface WhoAmI {
  auth: boolean;
  keyId: string | null;
  space: string;
  permissions: string[];
  operator: boolean;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly requestId: string | null = null,
  ) {
    super(message);
  }
}

// ---- a tiny store the shell subscribes to ----------------------------------------------------

type Listener = () => void;
const listeners = new Set<Listener>();
let session: Session | null = loadSession();
let signOutMessage: string | null = null;
let nodeDown = false;
let recoverTimer: number | null = null;
let recoveries = 0; // bumps each time the node answers again: pages reload on it

export function subscribe(listener: Listener): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

function notify(): void {
  for (const listener of [...listeners]) listener();
}

function loadSession(): Session | null {
  try {
    const raw = sessionStorage.getItem(SESSION_KEY);
    return raw ? (JSON.parse(raw) as Session) : null;
  } catch {
    return null;
  }
}

export function currentSession(): Session | null {
  return session;
}

export function lastSignOutMessage(): string | null {
  return signOutMessage;
}

export function isNodeDown(): boolean {
  return nodeDown;
}

export function recoveryCount(): number {
  return recoveries;
}

export function signIn(next: Session): void {
  session = next;
  signOutMessage = null;
  sessionStorage.setItem(SESSION_KEY, JSON.stringify(next));
  notify();
}

export function signOut(message: string | null = null): void {
  session = null;
  signOutMessage = message;
  sessionStorage.removeItem(SESSION_KEY);
  notify();
}

export function hasPermission(permission: string): boolean {
  return session !== null && (session.operator || session.permissions.includes(permission));
}

function markDown(): void {
  if (!nodeDown) {
    nodeDown = true;
    notify();
  }
  if (recoverTimer === null) recoverTimer = window.setTimeout(checkRecovered, RETRY_MS);
}

async function checkRecovered(): Promise<void> {
  recoverTimer = null;
  try {
    const answer = await fetch("/v1/health", { cache: "no-store", signal: AbortSignal.timeout(RETRY_MS * 2) });
    await answer.text();
    markUp();
  } catch {
    markDown();
  }
}

function markUp(): void {
  if (nodeDown) {
    nodeDown = false;
    recoveries += 1;
    notify();
  }
}

// ---- requests ----------------------------------------------------------------------------------

export type Query = Record<string, string | number | boolean | null | undefined>;

export interface CallOptions {
  query?: Query;
  body?: unknown;
  signal?: AbortSignal;
  key?: string | null; // override the session's key (sign-in tries a key before keeping it)
  noSignOut?: boolean; // a 401 is the caller's to show (sign-in)
}

export function withQuery(path: string, query?: Query): string {
  if (!query) return path;
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== null && value !== undefined && value !== "") params.set(name, String(value));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

/** A path under the signed-in space: spacePath("/scopes") is /v1/spaces/<space>/scopes. */
export function spacePath(path: string): string {
  const space = session?.space ?? "default";
  return `/v1/spaces/${encodeURIComponent(space)}${path}`;
}

export async function call<T>(method: string, path: string, options: CallOptions = {}): Promise<T> {
  const headers: Record<string, string> = { Accept: "application/json" };
  const key = options.key !== undefined ? options.key : session?.key ?? null;
  if (key) headers.Authorization = `Bearer ${key}`;
  let body: string | undefined;
  if (options.body !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(options.body);
  }
  const timeout = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
  const signal = options.signal ? anySignal([options.signal, timeout]) : timeout;
  let answer: Response;
  try {
    answer = await fetch(withQuery(path, options.query), { method, headers, body, signal, cache: "no-store" });
  } catch (error) {
    if (options.signal?.aborted) throw error; // the page went away: nothing to report
    markDown();
    throw new ApiError(0, "NOT_ANSWERING", `the node at ${location.origin} is not answering; retrying`);
  }
  markUp();
  const text = await answer.text();
  let parsed: unknown = null;
  if (text) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = null;
    }
  }
  if (answer.ok) return parsed as T;
  const envelope = (parsed as { error?: { code?: string; message?: string; requestId?: string } } | null)?.error;
  const error = new ApiError(
    answer.status,
    envelope?.code ?? `HTTP_${answer.status}`,
    envelope?.message ?? `${method} ${path} answered ${answer.status}`,
    envelope?.requestId ?? null,
  );
  if (answer.status === 401 && !options.noSignOut && session !== null) {
    signOut(`Signed out: ${error.message}. Sign in again with a valid key.`);
  }
  if (answer.status === 502 || answer.status === 504) markDown();
  throw error;
}

export const get = <T>(path: string, options: CallOptions = {}) => call<T>("GET", path, options);
export const post = <T>(path: string, body?: unknown, options: CallOptions = {}) =>
  call<T>("POST", path, { ...options, body: body ?? {} });

function anySignal(signals: AbortSignal[]): AbortSignal {
  const controller = new AbortController();
  for (const signal of signals) {
    if (signal.aborted) {
      controller.abort(signal.reason);
      break;
    }
    signal.addEventListener("abort", () => controller.abort(signal.reason), { once: true });
  }
  return controller.signal;
}

/** "your key lacks <permission>" for a 403 FORBIDDEN, else the error's own message. */
export function describe(error: unknown): string {
  if (error instanceof ApiError) {
    if (error.status === 403 && error.code === "FORBIDDEN") {
      const needed = /needs the (\S+) permission/.exec(error.message)?.[1];
      return needed ? `Your key lacks ${needed}. (${error.message})` : error.message;
    }
    if (error.status === 404 && error.code === "NOT_FOUND" && /^no route /.test(error.message)) {
      return `This page needs a newer node (${error.message}).`;
    }
    return `${error.code}: ${error.message}`;
  }
  return error instanceof Error ? error.message : String(error);
}
