/** Reading `slayer/search` hits into `slayer/inspect` refs and inspect results into a location. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { findLocation, inspectRef } from "../src/wire";

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
