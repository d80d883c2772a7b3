#!/usr/bin/env node
// Launcher of examples/gpt/profile.ts: where a training step's time goes (host, device, native calls).
'use strict';
require('./register-ts');

require('./profile.ts').main(process.argv.slice(2)).then(
  () => {},
  (err) => { console.error(err); process.exitCode = 1; },
);
