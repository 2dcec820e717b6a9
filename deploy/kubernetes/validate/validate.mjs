#!/usr/bin/env node
// Validates Kubernetes objects offline against the pinned schemas of
// package-lock.json beside this file (kubernetes-models: Kubernetes' own
// OpenAPI definitions; @kubernetes-models/prometheus-operator: the operator's
// CRD schemas), in two passes over each object:
//
//   schema  the model's validator, compiled from the OpenAPI / CRD schema:
//           required fields, types, enums, formats (int32, quantities, ...)
//   fields  the model's type declarations, with TypeScript's excess property
//           check: a field that the kind does not have (a typo, a field at
//           the wrong level) is an error, as it is for `kubectl apply`
//           (field validation Strict); the schema pass lets it through.
//
//   deploy/kubernetes/validate/validate.mjs NODE_MODULES < objects.json
//
// NODE_MODULES: where `npm ci` installed this package's lock
// (build/tools/kubernetes/node_modules, by scripts/install-deps.sh --test).
// objects.json: a JSON array of objects (a rendered kustomization).
// Prints {"checked": ["Kind/name", ...], "errors": [{"object", "check",
// "message"}]} and exits 0 when there is no error, 1 otherwise, 2 when it
// could not run. An apiVersion/kind without a model is an error: nothing is
// passed unchecked. integration/test_kubernetes.py runs it.
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

// API groups whose models live outside kubernetes-models.
const PACKAGES = { "monitoring.coreos.com": "@kubernetes-models/prometheus-operator" };

function model(modules, apiVersion, kind) {
  const slash = apiVersion.indexOf("/");
  const group = slash < 0 ? "" : apiVersion.slice(0, slash);
  const pkg = PACKAGES[group] ?? "kubernetes-models";
  const specifier = `${pkg}/${apiVersion}/${kind}`;  // kubernetes-models/v1/Service, .../apps/v1/StatefulSet
  const file = join(modules, pkg, apiVersion, `${kind}.js`);
  return existsSync(file) ? { specifier, file } : null;
}

function label(obj, i) {
  const name = obj?.metadata?.name ?? `#${i}`;
  return `${obj?.kind ?? "?"}/${name}`;
}

async function schemaPass(modules, objects, errors) {
  const found = [];
  for (const [i, obj] of objects.entries()) {
    const m = obj && typeof obj.apiVersion === "string" && typeof obj.kind === "string"
      ? model(modules, obj.apiVersion, obj.kind) : null;
    if (!m) {
      errors.push({ object: label(obj, i), check: "schema",
                    message: `no schema for apiVersion ${obj?.apiVersion} kind ${obj?.kind}` });
      found.push(null);
      continue;
    }
    const Model = (await import(pathToFileURL(m.file).href))[obj.kind];
    if (typeof Model !== "function" || Model.apiVersion !== obj.apiVersion || Model.kind !== obj.kind) {
      errors.push({ object: label(obj, i), check: "schema", message: `${m.specifier} is not the model of ${obj.apiVersion} ${obj.kind}` });
      found.push(null);
      continue;
    }
    try {
      new Model(obj).validate();
    } catch (e) {
      errors.push({ object: label(obj, i), check: "schema", message: String(e.message ?? e) });
    }
    found.push(m);
  }
  return found;
}

async function fieldsPass(modules, objects, found, errors) {
  const ts = (await import(pathToFileURL(join(modules, "typescript", "lib", "typescript.js")).href)).default;
  const dir = mkdtempSync(join(tmpdir(), "smockron-k8s-types-"));
  try {
    symlinkSync(modules, join(dir, "node_modules"), "dir");
    // One object a line, so that a diagnostic's line names its object.
    const imports = [], lines = [], lineOf = [];
    objects.forEach((obj, i) => {
      if (!found[i]) return;
      imports.push(`import type { I${obj.kind} as T${i} } from ${JSON.stringify(found[i].specifier)};`);
    });
    const header = imports.length;
    objects.forEach((obj, i) => {
      if (!found[i]) return;
      lines.push(`export const o${i}: T${i} = ${JSON.stringify(obj)};`);
      lineOf.push(i);
    });
    const file = join(dir, "objects.mts");
    writeFileSync(file, [...imports, ...lines].join("\n") + "\n");
    const program = ts.createProgram([file], {
      strict: true, noEmit: true, skipLibCheck: true, types: [],
      module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext,
      target: ts.ScriptTarget.ES2022,
    });
    for (const d of ts.getPreEmitDiagnostics(program)) {
      const text = ts.flattenDiagnosticMessageText(d.messageText, "\n");
      if (!d.file || d.file.fileName !== program.getSourceFile(file)?.fileName) {
        errors.push({ object: "(declarations)", check: "fields", message: text });
        continue;
      }
      const { line, character } = d.file.getLineAndCharacterOfPosition(d.start ?? 0);
      const i = line >= header ? lineOf[line - header] : undefined;
      const src = d.file.text.split("\n")[line] ?? "";
      const at = src.slice(Math.max(0, character - 40), character + 60);
      errors.push({ object: i === undefined ? "(imports)" : label(objects[i], i), check: "fields",
                    message: `${text} (at ...${at}...)` });
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main() {
  const modules = process.argv[2];
  if (!modules || !existsSync(join(modules, "kubernetes-models"))) {
    process.stderr.write(`usage: validate.mjs NODE_MODULES < objects.json (no kubernetes-models in ${modules})\n`);
    process.exit(2);
  }
  const objects = JSON.parse(readFileSync(0, "utf8"));
  if (!Array.isArray(objects)) throw new Error("stdin: expected a JSON array of objects");
  const errors = [];
  const found = await schemaPass(modules, objects, errors);
  await fieldsPass(modules, objects, found, errors);
  process.stdout.write(JSON.stringify({ checked: objects.map(label), errors }, null, 1) + "\n");
  process.exit(errors.length ? 1 : 0);
}

main().catch((e) => {
  process.stderr.write(`validate.mjs: ${e.stack ?? e}\n`);
  process.exit(2);
});
