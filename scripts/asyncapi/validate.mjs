// Parses an AsyncAPI document with the reference parser (@asyncapi/parser: schema validation,
// $ref resolution including docs/schemas/*.json, and its built-in Spectral rules). Prints each
// diagnostic; exits 1 on any error or warning. On success prints one JSON line: every
// channel's address with the names of its messages (tests/event_contract.rs compares them
// with the event types of the code).
import { Parser, fromFile } from '@asyncapi/parser';

const path = process.argv[2];
if (!path) {
  console.error('usage: node validate.mjs <asyncapi.yaml>');
  process.exit(2);
}
const SEVERITY = ['error', 'warning', 'info', 'hint'];
const { document, diagnostics } = await fromFile(new Parser(), path).parse();
let bad = 0;
for (const d of diagnostics) {
  const level = SEVERITY[d.severity] ?? String(d.severity);
  console.error(`${level}: ${d.code}: ${d.message} at ${JSON.stringify(d.path)}`);
  if (d.severity <= 1) bad += 1;
}
if (!document || bad > 0) {
  console.error(`${bad} error(s)/warning(s)`);
  process.exit(1);
}
const channels = {};
for (const ch of document.channels().all()) {
  channels[ch.address()] = ch.messages().all().map((m) => m.name()).sort();
}
console.log(JSON.stringify({ version: document.version(), channels }));
