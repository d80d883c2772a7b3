// Lets `require` load the example's TypeScript sources and lib/ through TypeScript's transpiler (a
// devDependency), so a checkout runs the example without a `tsc` step.
'use strict';
const fs = require('fs');
const ts = require('typescript');

require.extensions['.ts'] = (module, filename) => {
  const out = ts.transpileModule(fs.readFileSync(filename, 'utf8'), {
    fileName: filename,
    compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022, esModuleInterop: true, sourceMap: false },
  });
  module._compile(out.outputText, filename);
};
