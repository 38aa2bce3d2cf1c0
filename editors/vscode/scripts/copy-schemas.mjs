// Copies the JSON Schemas of SLayer query files and memory front matter (generated from the server's
// definitions by protocol/generate.py) into the extension, for the YAML and JSON language services.
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const from = join(here, "..", "..", "..", "protocol", "file-schemas");
const to = join(here, "..", "schemas");
mkdirSync(to, { recursive: true });
for (const name of ["query-file.schema.json", "memory-file.schema.json"]) {
  copyFileSync(join(from, name), join(to, name));
}
