// Validates Kubernetes objects against the OpenAPI schemas compiled into the kubernetes-models npm package.
// Run by tests/deploy/test_k8s_manifests.py: stdin is a JSON array of {file, index, doc}; stdout a JSON array of results.
//   node tests/deploy/validate_k8s.mjs --models tests/tools/node_modules/kubernetes-models < docs.json
import { readFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const modelsFlag = process.argv.indexOf("--models");
if (modelsFlag < 0 || !process.argv[modelsFlag + 1]) {
  console.error("usage: validate_k8s.mjs --models DIR/kubernetes-models < docs.json");
  process.exit(2);
}
const modelsDir = path.resolve(process.argv[modelsFlag + 1]);

// apiVersion "apps/v1" -> "apps/v1"; core "v1" -> "v1" (the package's directory layout).
function modulePath(apiVersion, kind) {
  return path.join(modelsDir, ...apiVersion.split("/"), `${kind}.js`);
}

const docs = JSON.parse(readFileSync(0, "utf8"));
const results = [];
for (const { file, index, doc } of docs) {
  const where = { file, index, kind: doc?.kind, name: doc?.metadata?.name };
  if (!doc || typeof doc.apiVersion !== "string" || typeof doc.kind !== "string") {
    results.push({ ...where, ok: false, error: "document has no apiVersion/kind" });
    continue;
  }
  let Model;
  try {
    Model = (await import(pathToFileURL(modulePath(doc.apiVersion, doc.kind)).href))[doc.kind];
  } catch (e) {
    results.push({ ...where, ok: false, error: `no kubernetes-models class for ${doc.apiVersion} ${doc.kind}` });
    continue;
  }
  try {
    new Model(doc).validate();
    results.push({ ...where, ok: true });
  } catch (e) {
    results.push({ ...where, ok: false, error: String(e.message ?? e) });
  }
}
process.stdout.write(JSON.stringify(results));
