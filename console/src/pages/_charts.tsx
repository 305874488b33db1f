// Small SVG charts of the Overview, Queues and Capacity pages (no library): a time series kept while
// the page is open (useSeries), a sparkline, a line chart with axes, a tally of events per interval
// read from the space's event log (useEventRate), and the log's recent history (useEventLog) with
// what it tells of the past: events per interval (eventRate), queue depth (depthHistory).

import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, get, spacePath } from "../api";
import { type Loaded, useData } from "../live";

export interface Point {
  at: number; // ms since the epoch
  value: number;
}

const SERIES_POINTS_MAX = 600; // one sample a second for ten minutes at most

/** `points` with the sample (`at`, `value`) appended, those older than `windowMs` dropped (a
 * sample closer than 250 ms to the previous one replaces it). */
function appended(points: Point[], at: number, value: number, windowMs: number): Point[] {
  const kept = points.filter((point) => at - point.at <= windowMs);
  const last = kept[kept.length - 1];
  if (last && at - last.at < 250) kept.pop();
  kept.push({ at, value });
  return kept.slice(-SERIES_POINTS_MAX);
}

/** Samples of a value over the last `windowMs`, kept client-side while the page is open. */
export function useSeries(windowMs: number): { points: Point[]; add: (value: number) => void } {
  const [points, setPoints] = useState<Point[]>([]);
  const add = (value: number) => setPoints((old) => appended(old, Date.now(), value, windowMs));
  return { points, add };
}

/** A keyed set of series (one per permit, allowance, budget), sampled together. */
export function useSeriesMap(windowMs: number): { series: Record<string, Point[]>; add: (values: Record<string, number>) => void } {
  const [series, setSeries] = useState<Record<string, Point[]>>({});
  const add = (values: Record<string, number>) => {
    const at = Date.now();
    setSeries((old) => Object.fromEntries(
      Object.entries(values).map(([key, value]) => [key, appended(old[key] ?? [], at, value, windowMs)]),
    ));
  };
  return { series, add };
}

function path(points: Point[], x: (at: number) => number, y: (value: number) => number): string {
  // A step line: a value holds until the next sample.
  let d = "";
  points.forEach((point, index) => {
    const px = x(point.at).toFixed(1);
    const py = y(point.value).toFixed(1);
    if (index === 0) d += `M${px},${py}`;
    else d += `H${px}V${py}`;
  });
  return d;
}

/** A sparkline of `points` over the last `windowMs` against `max` (usage of a capacity); a dot
 * marks the level now. */
export function Sparkline(props: { points: Point[]; max: number; windowMs: number; name: string; label: string }) {
  const width = 120;
  const height = 28;
  const now = Date.now();
  const points = props.points.length ? [...props.points, { at: now, value: props.points[props.points.length - 1].value }] : [];
  const max = Math.max(props.max, 1, ...points.map((point) => point.value));
  const x = (at: number) => (width - 3) - ((now - at) / props.windowMs) * (width - 3);
  const y = (value: number) => height - 3 - (value / max) * (height - 6);
  return (
    <svg class="sparkline" data-sparkline={props.name} viewBox={`0 0 ${width} ${height}`} width={width} height={height}
      role="img" aria-label={props.label}>
      <title>{props.label}</title>
      <line x1="0" x2={width} y1={y(props.max)} y2={y(props.max)} class="spark-limit" />
      {points.length ? <path d={path(points, x, y)} class="spark-line" /> : null}
      {points.length ? <circle cx={x(now)} cy={y(points[points.length - 1].value)} r="2.5" class="spark-now" /> : null}
    </svg>
  );
}

export interface ChartLine {
  name: string;
  label: string;
  points: Point[];
  step?: boolean; // a sampled level (queue depth) rather than a count per interval
}

/** A line chart with a time axis over the last `windowMs` and a value axis from 0. */
export function LineChart(props: { name: string; title: string; lines: ChartLine[]; windowMs: number }) {
  const width = 600;
  const height = 140;
  const now = Date.now();
  const all = props.lines.flatMap((line) => line.points.map((point) => point.value));
  const max = Math.max(1, ...all);
  const x = (at: number) => (1 - (now - at) / props.windowMs) * (width - 2);
  const y = (value: number) => 4 + (1 - value / max) * (height - 6);
  const minutes = Math.round(props.windowMs / 60_000);
  return (
    <figure class="chart" data-chart={props.name}>
      <figcaption>
        {props.title}
        {props.lines.map((line, index) => (
          <span class={`chart-key chart-key-${index}`}>{line.label}</span>
        ))}
      </figcaption>
      <div class="chart-plot">
        <svg viewBox={`0 0 ${width} ${height}`} preserveAspectRatio="none" role="img" aria-label={props.title}>
          <line x1="0" x2={width} y1={y(0)} y2={y(0)} class="chart-axis" />
          <line x1="0" x2="0" y1="0" y2={y(0)} class="chart-axis" />
          {props.lines.map((line, index) => {
            const points = line.points.filter((point) => now - point.at <= props.windowMs);
            if (!points.length) return null;
            const shown = line.step ? [...points, { at: now, value: points[points.length - 1].value }] : points;
            const d = line.step
              ? path(shown, x, y)
              : shown.map((point, i) => `${i ? "L" : "M"}${x(point.at).toFixed(1)},${y(point.value).toFixed(1)}`).join("");
            // data-from: when its first point is (ms since the epoch): a chart that starts from the
            // node's history starts before the page opened.
            return <path d={d} class={`chart-line chart-line-${index}`} data-line={line.name} data-from={points[0].at} />;
          })}
        </svg>
        {/* Labels in HTML: the plot stretches to its box, text must not. */}
        <span class="chart-label chart-max">{max}</span>
        <span class="chart-label chart-zero">0</span>
        <span class="chart-label chart-from">-{minutes} min</span>
        <span class="chart-label chart-now">now</span>
      </div>
    </figure>
  );
}

interface EventsPage {
  events: { eventId: string; cursor: string; createdAt: string }[];
  nextCursor: string;
}

const TALLY_PAGE_MAX = 1000;
const TALLY_PAGES_MAX = 20; // the space's log keeps at most 10 000 events
const TALLY_WAIT_S = 20;
const TALLY_RETRY_MS = 2000;

/** How many events of `types` the space's log records per `bucketMs` over the last `windowMs`:
 * counted from the log's history when the page opens, then from the watch as they come. The
 * total so far is `total` (the test hook reads it). */
export function useEventRate(types: string[], bucketMs: number, windowMs: number): { points: Point[]; total: number } {
  const [counts, setCounts] = useState<Map<number, number>>(new Map());
  const [total, setTotal] = useState(0);
  const key = types.join(",");
  const counted = useRef(0); // the log's number (cursor) of the last event counted: a re-read skips to after it
  useEffect(() => {
    const controller = new AbortController();
    const signal = controller.signal;
    counted.current = 0;
    setCounts(new Map());
    setTotal(0);
    const tally = (events: EventsPage["events"]) => {
      const fresh = events.filter((event) => Number(event.cursor) > counted.current);
      if (!fresh.length) return;
      counted.current = Math.max(counted.current, ...fresh.map((event) => Number(event.cursor)));
      const oldest = Date.now() - windowMs - bucketMs;
      setCounts((old) => {
        const next = new Map([...old].filter(([bucket]) => bucket >= oldest));
        for (const event of fresh) {
          const at = Date.parse(event.createdAt);
          if (Number.isNaN(at) || at < oldest) continue;
          const bucket = Math.floor(at / bucketMs) * bucketMs;
          next.set(bucket, (next.get(bucket) ?? 0) + 1);
        }
        return next;
      });
      setTotal((old) => old + fresh.length);
    };
    const page = (cursor: string | null, waitSeconds: number) =>
      get<EventsPage>(spacePath("/watch"), { query: { types: key, cursor, waitSeconds, limit: TALLY_PAGE_MAX }, signal });
    const sleep = (ms: number) => new Promise<void>((resolve) => {
      const id = window.setTimeout(resolve, ms);
      signal.addEventListener("abort", () => { window.clearTimeout(id); resolve(); });
    });
    (async () => {
      let cursor: string | null = null;
      let catchingUp = true; // reading the log's history, page after page, without waiting
      let pages = 0;
      while (!signal.aborted) {
        try {
          const found: EventsPage = await page(cursor, catchingUp ? 0 : TALLY_WAIT_S);
          cursor = found.nextCursor;
          tally(found.events);
          pages += 1;
          if (found.events.length < TALLY_PAGE_MAX || pages >= TALLY_PAGES_MAX) catchingUp = false;
        } catch (error) {
          if (signal.aborted) return;
          if (error instanceof ApiError && error.code === "CURSOR_EXPIRED") {
            cursor = null; // events were dropped: read again what the log keeps (counted skips what was)
            catchingUp = true;
            pages = 0;
            continue;
          }
          if (error instanceof ApiError && error.status === 401) return; // signed out
          await sleep(TALLY_RETRY_MS);
        }
      }
    })();
    return () => controller.abort();
  }, [key, bucketMs, windowMs]);
  const now = Date.now();
  const points: Point[] = [];
  const last = Math.floor(now / bucketMs) * bucketMs;
  for (let bucket = last - Math.floor(windowMs / bucketMs) * bucketMs; bucket <= last; bucket += bucketMs) {
    points.push({ at: Math.min(bucket + bucketMs / 2, now), value: counts.get(bucket) ?? 0 }); // the current one: at now
  }
  return { points, total };
}

// ---- the log's recent history ---------------------------------------------------------------------

export interface LogEvent {
  eventId: string;
  cursor: string;
  type: string;
  createdAt: string;
  scopeId: string | null;
  payload: Record<string, unknown>;
}

export const LOG_PAGE = 1000; // events asked for per page of the log
export const LOG_PAGES_MAX = 10; // the space's log keeps at most 10 000 events

/** The events of `types` over the last `windowMs` (the log keeps an hour at most), oldest first:
 * read whole when the page opens, then only what came after on each reload. */
export function useEventLog(types: string[], windowMs: number): Loaded<LogEvent[]> {
  const kept = useRef<{ cursor: string | null; events: LogEvent[] }>({ cursor: null, events: [] });
  const key = types.join(",");
  return useData(async (signal) => {
    let { cursor, events } = kept.current;
    const fresh: LogEvent[] = [];
    for (let pages = 0; pages < LOG_PAGES_MAX; pages++) {
      let page: { events: LogEvent[]; nextCursor: string };
      try {
        page = await get(spacePath("/events"), { query: { types: key, cursor, limit: LOG_PAGE }, signal });
      } catch (error) {
        if (!(error instanceof ApiError && error.code === "CURSOR_EXPIRED")) throw error;
        cursor = null; // events were dropped since: read again what the log keeps
        events = [];
        continue;
      }
      fresh.push(...page.events);
      cursor = page.nextCursor;
      if (page.events.length < LOG_PAGE) break;
    }
    const oldest = Date.now() - windowMs;
    kept.current = { cursor, events: [...events, ...fresh].filter((event) => Date.parse(event.createdAt) >= oldest) };
    return kept.current.events;
  }, [key, windowMs]);
}

/** Events per `bucketMs` over the last `windowMs`, from events read from the log. */
export function eventRate(events: LogEvent[], bucketMs: number, windowMs: number, now: number): Point[] {
  const counts = new Map<number, number>();
  for (const event of events) {
    const bucket = Math.floor(Date.parse(event.createdAt) / bucketMs) * bucketMs;
    counts.set(bucket, (counts.get(bucket) ?? 0) + 1);
  }
  const points: Point[] = [];
  const last = Math.floor(now / bucketMs) * bucketMs;
  for (let bucket = last - Math.floor(windowMs / bucketMs) * bucketMs; bucket <= last; bucket += bucketMs) {
    points.push({ at: Math.min(bucket + bucketMs / 2, now), value: counts.get(bucket) ?? 0 });
  }
  return points;
}

// The state a task most likely left when the log holds no earlier event of it (it began before the
// log's oldest event): a worker completes or fails what it holds; a cancel or deadline may end
// either, and a queued task is the likelier.
const STATE_BEFORE: Record<string, string | null> = {
  "task.created": null, "task.running": "QUEUED", "task.queued": "RUNNING", "task.succeeded": "RUNNING",
  "task.failed": "RUNNING", "task.cancelled": "QUEUED", "task.expired": "QUEUED",
};

/** The space's queued and in-flight counts over the log's history, worked back from the counts now
 * (`queuedNow`, `inFlightNow`) through the task events (each one moves a task from its state
 * before to the one it names). */
export function depthHistory(events: LogEvent[], queuedNow: number, inFlightNow: number): { queued: Point[]; inFlight: Point[] } {
  const last = new Map<string, string>();
  const deltas: { at: number; queued: number; inFlight: number }[] = [];
  for (const event of events) {
    if (!(event.type in STATE_BEFORE)) continue;
    const task = String(event.payload.taskId);
    const after = String(event.payload.state);
    const before = last.has(task) ? last.get(task)! : STATE_BEFORE[event.type];
    last.set(task, after);
    deltas.push({
      at: Date.parse(event.createdAt),
      queued: Number(after === "QUEUED") - Number(before === "QUEUED"),
      inFlight: Number(after === "RUNNING") - Number(before === "RUNNING"),
    });
  }
  const queued: Point[] = [];
  const inFlight: Point[] = [];
  let q = queuedNow;
  let r = inFlightNow;
  for (let i = deltas.length - 1; i >= 0; i--) {
    queued.push({ at: deltas[i].at, value: Math.max(0, q) });
    inFlight.push({ at: deltas[i].at, value: Math.max(0, r) });
    q -= deltas[i].queued;
    r -= deltas[i].inFlight;
  }
  if (deltas.length) {
    queued.push({ at: deltas[0].at - 1, value: Math.max(0, q) });
    inFlight.push({ at: deltas[0].at - 1, value: Math.max(0, r) });
  }
  return { queued: queued.reverse(), inFlight: inFlight.reverse() };
}
