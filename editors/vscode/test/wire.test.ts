/** `slayer/search` params and hits, `slayer/inspect` refs, and inspect results into a location. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { findLocation, hitText, inspectRef, otherRanking, type SearchHit, searchParams } from "../src/wire";

const loc = (uri: string) => ({ uri, range: { start: { line: 3, character: 2 }, end: { line: 3, character: 9 } } });

describe("inspectRef", () => {
  const cases: [string, string, string][] = [
    ["memory", "7", "memory:7"],
    ["memory", "help.joins", "memory:help.joins"],
    ["memory", "memory:7", "memory:7"],
    ["column", "jaffle.orders.amount", "jaffle.orders.amount"],
    ["model", "jaffle.orders", "jaffle.orders"],
  ];
  for (const [kind, id, expected] of cases) {
    it(`${kind} ${id}`, () => assert.equal(inspectRef(kind, id), expected));
  }
});

describe("findLocation", () => {
  const a = loc("file:///s/models/jaffle/orders.yaml");
  const b = loc("file:///s/memories/7.md");
  const cases: { name: string; result: unknown; expected: unknown }[] = [
    { name: "top level", result: { location: a }, expected: a },
    { name: "keyed by ref", result: { "memory:7": { location: b } }, expected: b },
    { name: "entry naming the ref", result: { items: [{ id: "x", location: a }, { id: "memory:7", location: b }] }, expected: b },
    { name: "bare list, first with a location", result: [{ id: "other" }, { id: "y", location: a }], expected: a },
    { name: "no location", result: { items: [{ id: "memory:7", location: null }] }, expected: undefined },
    { name: "malformed location", result: { location: { uri: 5 } }, expected: undefined },
    { name: "null result", result: null, expected: undefined },
  ];
  for (const c of cases) {
    it(c.name, () => assert.deepEqual(findLocation(c.result, "memory:7"), c.expected));
  }
});

describe("searchParams", () => {
  const cases: { name: string; args: Parameters<typeof searchParams>; expected: unknown }[] = [
    { name: "hybrid, no hops", args: ["net sales", 50, "hybrid", 0], expected: { question: "net sales", max_results: 50, ranking: "hybrid" } },
    { name: "slayer", args: ["net sales", 50, "slayer", 0], expected: { question: "net sales", max_results: 50, ranking: "slayer" } },
    { name: "hybrid with hops", args: ["q", 10, "hybrid", 2], expected: { question: "q", max_results: 10, ranking: "hybrid", related: 2 } },
    { name: "hops bounded like the server", args: ["q", 10, "hybrid", 9], expected: { question: "q", max_results: 10, ranking: "hybrid", related: 3 } },
    { name: "slayer refuses related, so it is left out", args: ["q", 10, "slayer", 2], expected: { question: "q", max_results: 10, ranking: "slayer" } },
  ];
  for (const c of cases) {
    it(c.name, () => assert.deepEqual(searchParams(...c.args), c.expected));
  }

  it("otherRanking toggles", () => {
    assert.equal(otherRanking("hybrid"), "slayer");
    assert.equal(otherRanking("slayer"), "hybrid");
  });
});

describe("hitText", () => {
  const hit = (extra: Partial<SearchHit>): SearchHit => ({ kind: "memory", id: "7", score: 1.23456, ...extra });
  const cases: { name: string; hit: SearchHit; expected: unknown }[] = [
    {
      name: "column with description and matched entities",
      hit: { kind: "column", id: "jaffle.orders.subtotal", score: 5.7218, description: "Pre-tax amount.\nIn dollars.", matched_entities: ["jaffle.orders"] },
      expected: { label: "$(symbol-field) jaffle.orders.subtotal", description: "column 5.722 · jaffle.orders", detail: "Pre-tax amount." },
    },
    {
      name: "memory reached by a link hop",
      hit: hit({ via: "memory:3", description: "Refunds are negative orders." }),
      expected: { label: "$(note) 7", description: "memory 1.235", detail: "via memory:3 · Refunds are negative orders." },
    },
    { name: "via without any prose", hit: hit({ via: "memory:3", text: "  " }), expected: { label: "$(note) 7", description: "memory 1.235", detail: "via memory:3" } },
    { name: "text when no description", hit: hit({ description: null, text: "learning: x" }), expected: { label: "$(note) 7", description: "memory 1.235", detail: "learning: x" } },
    { name: "nothing to show", hit: hit({ kind: "gizmo", via: "" }), expected: { label: "$(symbol-misc) 7", description: "gizmo 1.235", detail: undefined } },
  ];
  for (const c of cases) {
    it(c.name, () => assert.deepEqual(hitText(c.hit), c.expected));
  }

  it("cuts a long first line", () => {
    const detail = hitText(hit({ description: "x".repeat(500) })).detail!;
    assert.equal(detail.length, 160);
    assert.ok(detail.endsWith("…"));
  });
});
