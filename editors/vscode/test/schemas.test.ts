// The schemas contributed to VS Code's YAML and JSON services: every url of the manifest names a
// schema the build copied, and the query schema refuses what the server's diagnostics refuse.
import { strict as assert } from "node:assert";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

const root = join(__dirname, "..", "..");
const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));

test("every contributed schema url is a copied schema file", () => {
  const entries = [...manifest.contributes.yamlValidation, ...manifest.contributes.jsonValidation];
  assert.ok(entries.length >= 2);
  for (const entry of entries) {
    const file = join(root, entry.url);
    assert.ok(existsSync(file), `${entry.url} is missing (npm run schemas)`);
    const schema = JSON.parse(readFileSync(file, "utf8"));
    assert.equal(schema.$schema, "http://json-schema.org/draft-07/schema#");
  }
});

test("the query schema closes the stage to SlayerQuery's fields", () => {
  const schema = JSON.parse(readFileSync(join(root, "schemas", "query-file.schema.json"), "utf8"));
  const stage = schema.definitions.stage;
  assert.equal(stage.additionalProperties, false);
  for (const field of ["source_model", "measures", "dimensions", "filters", "limit"]) {
    assert.ok(field in stage.properties, field);
  }
});

test("query files of the server's default patterns are matched", () => {
  const yaml = manifest.contributes.yamlValidation.flatMap((e: { fileMatch: string[] }) => e.fileMatch);
  const json = manifest.contributes.jsonValidation.flatMap((e: { fileMatch: string[] }) => e.fileMatch);
  assert.ok(yaml.includes("*.query.yaml") && yaml.includes("**/queries/**/*.yaml"));
  assert.ok(json.includes("*.query.json") && json.includes("**/queries/**/*.json"));
});
