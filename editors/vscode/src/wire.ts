/**
 * Shapes of the custom requests the commands use, and the pure helpers that read them. Kept free of
 * `vscode` so they are tested in plain Node (see `test/`).
 */

/** One hit of SLayer's SearchResponse (as `slayer/search` returns it). */
export interface SearchHit {
  kind: string;
  id: string;
  score: number;
  text?: string;
  description?: string | null;
  matched_entities?: string[];
  query?: Record<string, unknown> | null;
}

export interface SearchResponse {
  results?: SearchHit[];
  resolved_input_entities?: string[];
  warnings?: string[];
}

export interface WireLocation {
  uri: string;
  range: { start: { line: number; character: number }; end: { line: number; character: number } };
}

/** The id `slayer/inspect` expects for a search hit: memory hits carry bare ids. */
export function inspectRef(kind: string, id: string): string {
  return kind === "memory" && !id.startsWith("memory:") ? `memory:${id}` : id;
}

function isWireLocation(value: unknown): value is WireLocation {
  if (typeof value !== "object" || value === null) {
    return false;
  }
  const loc = value as Partial<WireLocation>;
  return typeof loc.uri === "string" && typeof loc.range === "object" && loc.range !== null;
}

/**
 * The `location` in an inspect result, which may sit on the result itself, under the key `ref`, or
 * on the entry for `ref` in a list of entries (else the first entry that has one: one ref was asked).
 */
export function findLocation(result: unknown, ref: string): WireLocation | undefined {
  if (typeof result !== "object" || result === null) {
    return undefined;
  }
  const direct = (result as { location?: unknown }).location;
  if (isWireLocation(direct)) {
    return direct;
  }
  const keyed = (result as Record<string, { location?: unknown } | undefined>)[ref]?.location;
  if (!Array.isArray(result) && isWireLocation(keyed)) {
    return keyed;
  }
  const lists = Array.isArray(result) ? [result] : Object.values(result).filter(Array.isArray);
  let fallback: WireLocation | undefined;
  for (const list of lists) {
    for (const entry of list as unknown[]) {
      const loc = (entry as { location?: unknown } | null)?.location;
      if (!isWireLocation(loc)) {
        continue;
      }
      const named = entry as { id?: unknown; ref?: unknown; canonical?: unknown };
      if (named.id === ref || named.ref === ref || named.canonical === ref) {
        return loc;
      }
      fallback ??= loc;
    }
  }
  return fallback;
}
