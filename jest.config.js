/** Jest runs the TypeScript tests in test/ directly through ts-jest (type errors fail the run). */
module.exports = {
  testEnvironment: '<rootDir>/test/environment.js',
  roots: ['<rootDir>/test'],
  testMatch: ['**/*.test.ts'],
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }] },
  testTimeout: 120000,
  // The native addon keeps worker threads per process; one Jest worker per core is plenty.
  maxWorkers: process.env.CI ? 2 : '50%',
};
