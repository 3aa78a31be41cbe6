// Preloaded into a CLI child (NODE_OPTIONS="--expose-gc --import <this file>") by timeout.test.ts:
// a garbage collection every 50 ms, so that anything the CLI's timeouts rely on but nothing holds
// (an AbortSignal.any of a timeout, for one) is collected while a call waits.
if (typeof globalThis.gc !== 'function') throw new Error('gc-preload.mjs needs node --expose-gc')
setInterval(() => globalThis.gc(), 50).unref()
