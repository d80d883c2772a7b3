/**
 * Jest 29's node environment runs tests in a vm context whose `Symbol` lacks the `Symbol.dispose`
 * and `Symbol.asyncDispose` that Node 20 adds to its main realm. Share Node's symbols with the test
 * realm, so `[Symbol.dispose]()` and `using` behave exactly as in a plain Node program.
 */
const { TestEnvironment } = require('jest-environment-node');

class NodeDisposeEnvironment extends TestEnvironment {
  constructor(config, context) {
    super(config, context);
    for (const name of ['dispose', 'asyncDispose']) {
      if (Symbol[name] && !this.global.Symbol[name]) {
        Object.defineProperty(this.global.Symbol, name, { value: Symbol[name] });
      }
    }
  }
}

module.exports = NodeDisposeEnvironment;
