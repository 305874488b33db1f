/**
 * The SDK's errors: one class per error code of the HTTP API, plus the SDK's own.
 *
 * Every error is a `RunstateError` with `code` (the API's code, e.g. `STALE_CLAIM`), `status` (the
 * HTTP status, or `undefined` when the SDK raised it without an answer) and `message`. Every 409
 * is a `ConflictError`; the specific codes have subclasses. `errorFromResponse` is the one place
 * that maps a server answer to a class.
 */

export class RunstateError extends Error {
  static readonly defaultCode: string = 'INTERNAL';
  static readonly defaultStatus: number | undefined = undefined;
  /** The API's error code, or the SDK's own for errors raised without an answer. */
  readonly code: string;
  /** The HTTP status of the answer; `undefined` when no answer was involved. */
  readonly status: number | undefined;
  /** The server's request id, when the answer carried one. */
  requestId?: string;
  /** `Retry-After` of the answer, in milliseconds, when it carried one. */
  retryAfterMs?: number;

  constructor(message: string, options: { code?: string; status?: number | null; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    const ctor = new.target as unknown as typeof RunstateError;
    this.name = new.target.name;
    this.code = options.code ?? ctor.defaultCode;
    this.status = options.status === null ? undefined : (options.status ?? ctor.defaultStatus);
  }
}

/** The server refused a request as malformed or over a bound (400 VALIDATION_FAILED). */
export class ValidationError extends RunstateError {
  static override readonly defaultCode: string = 'VALIDATION_FAILED';
  static override readonly defaultStatus: number | undefined = 400;
}

/** The SDK was misused locally (a bad argument or setting); raised before any request. */
export class ConfigError extends ValidationError {
  static override readonly defaultCode: string = 'CONFIG_ERROR';
  static override readonly defaultStatus: number | undefined = undefined;
}

/** The API key is missing or wrong (401 UNAUTHENTICATED). */
export class UnauthenticatedError extends RunstateError {
  static override readonly defaultCode: string = 'UNAUTHENTICATED';
  static override readonly defaultStatus: number | undefined = 401;
}

/** The API key lacks the permission for this call (403 FORBIDDEN). */
export class ForbiddenError extends RunstateError {
  static override readonly defaultCode: string = 'FORBIDDEN';
  static override readonly defaultStatus: number | undefined = 403;
}

/** The id or name is unknown, or belongs to another space (404 NOT_FOUND). */
export class NotFoundError extends RunstateError {
  static override readonly defaultCode: string = 'NOT_FOUND';
  static override readonly defaultStatus: number | undefined = 404;
}

/** The call conflicts with the current state (409). Base class of every 409. */
export class ConflictError extends RunstateError {
  static override readonly defaultCode: string = 'CONFLICT';
  static override readonly defaultStatus: number | undefined = 409;
}

/** The run, or a run above it, is cancelled or completed (409 SCOPE_CANCELLED). */
export class ScopeCancelledError extends ConflictError {
  static override readonly defaultCode: string = 'SCOPE_CANCELLED';
}

/** The run, or a run above it, is past its deadline (409 DEADLINE_EXCEEDED). */
export class DeadlineExceededError extends ConflictError {
  static override readonly defaultCode: string = 'DEADLINE_EXCEEDED';
}

/** The lease lapsed or was taken over by another worker (409 STALE_CLAIM). */
export class LeaseLostError extends ConflictError {
  static override readonly defaultCode: string = 'STALE_CLAIM';
}

/** Another holder's lease on the claim is live (409 CLAIM_HELD). */
export class ClaimHeldError extends ConflictError {
  static override readonly defaultCode: string = 'CLAIM_HELD';
}

/** The task key is already used with a different input (409 KEY_CONFLICT). */
export class KeyConflictError extends ConflictError {
  static override readonly defaultCode: string = 'KEY_CONFLICT';
}

/** The mailbox holds its backlogLimit of unfinished tasks (409 BACKLOG_FULL). */
export class BacklogFullError extends ConflictError {
  static override readonly defaultCode: string = 'BACKLOG_FULL';
}

/** A count bound of the state is reached (409 LIMIT_EXCEEDED). */
export class LimitExceededError extends ConflictError {
  static override readonly defaultCode: string = 'LIMIT_EXCEEDED';
}

/** A result over the server's bound of 64 KB (`code` RESULT_TOO_LARGE when the SDK refused it). */
export class ResultTooLargeError extends RunstateError {
  static override readonly defaultCode: string = 'RESULT_TOO_LARGE';
  static override readonly defaultStatus: number | undefined = 413;
}

/** No server could answer (503 UNAVAILABLE, or no answer at all: `status` undefined). */
export class UnavailableError extends RunstateError {
  static override readonly defaultCode: string = 'UNAVAILABLE';
  static override readonly defaultStatus: number | undefined = 503;
}

/** A request that is unsafe to repeat may have reached the server, but no answer came back. */
export class OutcomeUnknownError extends UnavailableError {}

/**
 * TLS with a server failed for a reason a retry would meet again, so the call is not retried: the
 * server's certificate does not verify against the client's CAs (`caFile`, else Node's: an unknown
 * CA, expired, issued for another host), or the server refused the handshake (it requires a client
 * certificate and the client has none it accepts), or it does not speak TLS. The server read no
 * request. `url` is the server's base URL, `reason` what failed; `status` is undefined.
 */
export class TlsError extends RunstateError {
  static override readonly defaultCode: string = 'TLS_FAILED';
  readonly url: string;
  readonly reason: string;

  constructor(url: string, reason: string, options: { cause?: unknown } = {}) {
    super(`${url}: ${reason}`, options.cause === undefined ? {} : { cause: options.cause });
    this.url = url;
    this.reason = reason;
  }
}

/** An events cursor is older than what the server keeps (410 CURSOR_EXPIRED). */
export class CursorExpiredError extends RunstateError {
  static override readonly defaultCode: string = 'CURSOR_EXPIRED';
  static override readonly defaultStatus: number | undefined = 410;
}

/** `ticket.result({ timeoutMs })` found no recorded result in time. The task may still finish. */
export class ResultTimeoutError extends RunstateError {
  static override readonly defaultCode: string = 'RESULT_TIMEOUT';
  readonly taskId: string;
  readonly timeoutMs: number;
  readonly state: string | undefined;

  constructor(taskId: string, timeoutMs: number, state?: string) {
    const last = state !== undefined ? ` (last state ${state})` : '';
    super(`task ${taskId} has no recorded result after ${timeoutMs} ms${last}`);
    this.taskId = taskId;
    this.timeoutMs = timeoutMs;
    this.state = state;
  }
}

/** A `wait({ timeoutMs })` on a barrier, timer or group ended before what it waits for happened. */
export class WaitTimeoutError extends RunstateError {
  static override readonly defaultCode: string = 'WAIT_TIMEOUT';
  readonly what: string;
  readonly timeoutMs: number;

  constructor(what: string, timeoutMs: number) {
    super(`${what} did not happen within ${timeoutMs} ms`);
    this.what = what;
    this.timeoutMs = timeoutMs;
  }
}

/** A job ended without a result: FAILED after its attempts. `attempts`, `taskId` (`jobId`). */
export class TaskFailedError extends RunstateError {
  static override readonly defaultCode: string = 'TASK_FAILED';
  readonly attempts: number;
  readonly taskId: string | undefined;
  /** The last error message the handler recorded. */
  readonly reason: string | undefined;

  constructor(message: string, options: { attempts?: number; taskId?: string; reason?: string; code?: string } = {}) {
    super(message, options.code === undefined ? {} : { code: options.code });
    this.attempts = options.attempts ?? 0;
    this.taskId = options.taskId;
    this.reason = options.reason;
  }

  /** The published clients' name for `taskId`. */
  get jobId(): string | undefined {
    return this.taskId;
  }
}

/** A `once` call failed after its attempts. `attempts`, `key`. */
export class OnceFailedError extends RunstateError {
  static override readonly defaultCode: string = 'ONCE_FAILED';
  readonly attempts: number;
  readonly key: string | undefined;

  constructor(message: string, options: { attempts?: number; key?: string } = {}) {
    super(message);
    this.attempts = options.attempts ?? 0;
    this.key = options.key;
  }
}

type ErrorClass = new (message: string, options?: { code?: string; status?: number | null }) => RunstateError;

const CLASS_BY_CODE: Record<string, ErrorClass> = {
  VALIDATION_FAILED: ValidationError,
  UNAUTHENTICATED: UnauthenticatedError,
  FORBIDDEN: ForbiddenError,
  NOT_FOUND: NotFoundError,
  CONFLICT: ConflictError,
  SCOPE_CANCELLED: ScopeCancelledError,
  DEADLINE_EXCEEDED: DeadlineExceededError,
  STALE_CLAIM: LeaseLostError,
  LEASE_RENEWALS_EXHAUSTED: LeaseLostError,
  CLAIM_HELD: ClaimHeldError,
  KEY_CONFLICT: KeyConflictError,
  LIMIT_EXCEEDED: LimitExceededError,
  BACKLOG_FULL: BacklogFullError,
  BARRIER_CANCELLED: ConflictError,
  BARRIER_RELEASED: ConflictError,
  IDEMPOTENCY_CONFLICT: ConflictError,
  RESULT_TOO_LARGE: ResultTooLargeError,
  UNAVAILABLE: UnavailableError,
  CURSOR_EXPIRED: CursorExpiredError,
};

const CLASS_BY_STATUS: Record<number, ErrorClass> = {
  400: ValidationError,
  401: UnauthenticatedError,
  403: ForbiddenError,
  404: NotFoundError,
  409: ConflictError,
  502: UnavailableError,
  503: UnavailableError,
  504: UnavailableError,
};

const CODE_BY_STATUS: Record<number, string> = {
  400: 'VALIDATION_FAILED',
  401: 'UNAUTHENTICATED',
  403: 'FORBIDDEN',
  404: 'NOT_FOUND',
  409: 'CONFLICT',
  502: 'UNAVAILABLE',
  503: 'UNAVAILABLE',
  504: 'UNAVAILABLE',
};

// The server's VALIDATION_FAILED for a value over a size bound says "... exceeds N bytes".
const TOO_LARGE = /exceeds \d+ bytes/;

/**
 * The error for a non-2xx answer: by its code, else (an unknown or missing code) by status. The
 * error keeps the server's code and status as they were, even when the class is chosen by status.
 */
export function errorFromResponse(status: number, code: string | undefined, message: string | undefined): RunstateError {
  let cls: ErrorClass | undefined = code ? CLASS_BY_CODE[code] : undefined;
  if (code === 'VALIDATION_FAILED' && message && TOO_LARGE.test(message)) cls = ResultTooLargeError;
  cls ??= CLASS_BY_STATUS[status] ?? RunstateError;
  const resolved = code || CODE_BY_STATUS[status] || 'INTERNAL';
  return new cls(message || `HTTP ${status}`, { code: resolved, status });
}

const STATUS_BY_CODE: Record<string, number> = {
  VALIDATION_FAILED: 400,
  UNAUTHENTICATED: 401,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  UNAVAILABLE: 503,
  INTERNAL: 500,
};

/** The error for one item's `{code, message}` in a batch answer. */
export function errorFromItem(error: { code?: string; message?: string }): RunstateError {
  const code = error.code || 'INTERNAL';
  const status = STATUS_BY_CODE[code] ?? (code in CLASS_BY_CODE ? 409 : 500);
  return errorFromResponse(status, code, error.message);
}
