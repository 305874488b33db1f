// Hash routing: "#/runs/abc" is the path "/runs/abc"; the page table is in routes.ts.

import { useEffect, useState } from "preact/hooks";
import type { Params, RouteEntry } from "./routes";

export function currentPath(): string {
  const hash = location.hash.replace(/^#/, "");
  return hash.startsWith("/") ? hash : "/";
}

export function useHashPath(): string {
  const [path, setPath] = useState(currentPath());
  useEffect(() => {
    const changed = () => setPath(currentPath());
    window.addEventListener("hashchange", changed);
    return () => window.removeEventListener("hashchange", changed);
  }, []);
  return path;
}

export function navigate(path: string): void {
  location.hash = `#${path}`;
}

/** "#/runs/<id>" for a link to a page, its segments encoded. */
export function href(...segments: string[]): string {
  return `#/${segments.map((segment) => encodeURIComponent(segment)).join("/")}`;
}

export function match(routes: RouteEntry[], path: string): { route: RouteEntry; params: Params } | null {
  const [pathOnly] = path.split("?");
  const parts = pathOnly.split("/").filter(Boolean);
  for (const route of routes) {
    const pattern = route.path.split("/").filter(Boolean);
    if (pattern.length !== parts.length) continue;
    const params: Params = {};
    let ok = true;
    for (let i = 0; i < pattern.length; i++) {
      if (pattern[i].startsWith(":")) {
        try {
          params[pattern[i].slice(1)] = decodeURIComponent(parts[i]);
        } catch {
          ok = false;
          break;
        }
      } else if (pattern[i] !== parts[i]) {
        ok = false;
        break;
      }
    }
    if (ok) return { route, params };
  }
  return null;
}

/** The query part of the hash ("#/runs?state=ACTIVE"). */
export function hashQuery(): URLSearchParams {
  const hash = location.hash;
  const at = hash.indexOf("?");
  return new URLSearchParams(at < 0 ? "" : hash.slice(at + 1));
}
