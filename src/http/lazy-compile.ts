/**
 * Schemas compiled at a route's first use, not at start-up.
 *
 * Fastify compiles a validator for every request part and a serializer for every response code of
 * every route when the app gets ready: with ~50 routes that was about a third of a broker's start-up
 * CPU (Ajv and fast-json-stringify, ~0.45 s of ~1.3 s), paid again by each process of a
 * HOOKQ_PROCESSES broker and at every restart, though most routes of a process are never called.
 * Here each compile waits for its first call; the function returned keeps the contract Fastify
 * reads (a validator's `errors` after a `false`). `compileAll` builds every one at once, so a test
 * still finds a schema that does not compile without calling its route.
 */
import SerializerSelector from '@fastify/fast-json-stringify-compiler'

type Compile<R> = () => R

/** Every lazy compile made for an app, so that a test can force them all. */
export class LazyCompiles {
  private readonly pending = new Set<() => unknown>()
  private done = 0

  /** A function that compiles `compile()` at its first call and forwards every call to the result. */
  validator<F extends (...args: never[]) => unknown>(compile: Compile<F & { errors?: unknown }>): F {
    let fn: (F & { errors?: unknown }) | undefined
    const force = () => (fn ??= this.count(compile))
    this.pending.add(force)
    const lazy = ((...args: never[]) => force()(...args)) as unknown as F
    // Fastify reads `errors` off the function it was given after a call returned false.
    Object.defineProperty(lazy, 'errors', { get: () => fn?.errors ?? null, set: () => {} })
    return lazy
  }

  serializer<F extends (data: unknown) => string>(compile: Compile<F>): F {
    let fn: F | undefined
    const force = () => (fn ??= this.count(compile))
    this.pending.add(force)
    return ((data: unknown) => force()(data)) as F
  }

  /** How many have been compiled so far. */
  get compiled(): number {
    return this.done
  }

  private count<R>(compile: Compile<R>): R {
    const r = compile()
    this.done++
    return r
  }

  /** Compiles every schema not compiled yet; throws the first compile error. */
  compileAll(): number {
    for (const force of this.pending) force()
    return this.pending.size
  }
}

/** Fastify's own serializer factory (fast-json-stringify), each serializer built at its first use. */
export function lazySerializerFactory(compiles: LazyCompiles) {
  const eager = SerializerSelector()
  return (externalSchemas: unknown, options: unknown) => {
    const compiler = eager(externalSchemas as never, options as never)
    return (route: Parameters<typeof compiler>[0]) => compiles.serializer(() => compiler(route))
  }
}
