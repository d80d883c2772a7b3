#!/usr/bin/env node
// Launcher of examples/gpt/main.ts: `node examples/gpt/train.js --help`. Loads the TypeScript
// sources of the example and of lib/ through TypeScript's transpiler (a devDependency), so a
// checkout needs no build step beyond the native addon.
'use strict';
require('./register-ts');

require('./main.ts').main(process.argv.slice(2)).then(
  (status) => { process.exitCode = status; },
  (err) => { console.error(err); process.exitCode = 1; },
);
