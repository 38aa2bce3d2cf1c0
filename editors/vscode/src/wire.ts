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
  /** A memory reached by a link hop (`related`): the `memory:<id>` it was reached from. */
  via?: string;
}

export interface SearchResponse {
  results?: SearchHit[];
  resolved_input_entities?: string[];
  warnings?: string[];
}

/** `ranking` of `slayer/search`: slayer-lsp's evidence scoring, or SLayer 1.4.1's exact pipeline. */
export const RANKINGS = ["hybrid", "slayer"] as const;
export type Ranking = (typeof RANKINGS)[number];

/** Hops through `memory:<id>` links the server follows at most (`MAX_RELATED_HOPS`). */
export const MAX_RELATED = 3;

export interface SearchRequest {
  question: string;
  max_results: number;
  ranking: Ranking;
  related?: number;
}

/** `slayer/search` params. `related` is sent only when it asks for hops: the slayer ranking refuses it. */
export function searchParams(question: string, maxResults: number, ranking: Ranking, related: number): SearchRequest {
  const params: SearchRequest = { question, max_results: maxResults, ranking };
  if (ranking === "hybrid" && related > 0) {
    params.related = Math.min(related, MAX_RELATED);
  }
  return params;
}

/** The other ranking, for the Search picker's toggle. */
export function otherRanking(ranking: Ranking): Ranking {
  return ranking === "hybrid" ? "slayer" : "hybrid";
}

const KIND_ICONS: Record<string, string> = {
  datasource: "database",
  model: "symbol-class",
  column: "symbol-field",
  measure: "symbol-number",
  aggregation: "symbol-operator",
  memory: "note",
};

function firstLine(text: string | null | undefined, limit = 160): string {
  const line = (text ?? "").trim().split(/\r?\n/, 1)[0] ?? "";
  return line.length > limit ? `${line.slice(0, limit - 1)}…` : line;
}

export interface HitText {
  label: string;
  description: string;
  detail: string | undefined;
}

/**
 * How a hit reads in the picker: icon and id; kind, score and matched entities; then the memory it
 * was reached from (when a link hop found it) and the first line of its description or text.
 */
export function hitText(hit: SearchHit): HitText {
  const icon = KIND_ICONS[hit.kind] ?? "symbol-misc";
  const score = typeof hit.score === "number" ? hit.score.toFixed(3) : "";
  const matched = hit.matched_entities?.length ? ` · ${hit.matched_entities.join(", ")}` : "";
  const via = typeof hit.via === "string" && hit.via !== "" ? `via ${hit.via}` : "";
  const summary = firstLine(hit.description) || firstLine(hit.text);
  return {
    label: `$(${icon}) ${hit.id}`,
    description: `${hit.kind} ${score}${matched}`,
    detail: [via, summary].filter((part) => part !== "").join(" · ") || undefined,
  };
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
